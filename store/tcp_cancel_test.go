package store

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// muteServer accepts TCPStore clients, answers the DialectV2 handshake
// (VALIDATE, PING) and then never answers again, as a server process that
// hangs. With read set it goes on reading (and discarding) what clients
// send, so that their requests are acknowledged; without it it stops
// reading, so that a client's writes fill the window and stay unacknowledged.
func muteServer(t *testing.T, read bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); _ = ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				var hello [10]byte // VALIDATE magic, PING nonce
				if _, err := io.ReadFull(nc, hello[:]); err != nil {
					return
				}
				if _, err := nc.Write(hello[6:]); err != nil {
					return
				}
				if read {
					_, _ = io.Copy(io.Discard, nc)
					return
				}
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// TestWaitTimeoutHungServer: a wait on a server that stops answering fails
// with its timeout, naming the server, after at most the CANCEL_WAIT
// exchange's bound (CancelTimeout, 1 s by default), not a store timeout
// more. The bound here is generous: it only fails a client whose error
// waits for an answer that never comes (it used to wait 10 s).
func TestWaitTimeoutHungServer(t *testing.T) {
	addr := muteServer(t, true)
	const timeout = 300 * time.Millisecond
	c := dial(t, addr, ClientOptions{Timeout: timeout})
	start := time.Now()
	_, err := c.Get(context.Background(), "never")
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Get on a hung server: %v; want ErrTimeout naming %s", err, addr)
	}
	if took > timeout+5*time.Second {
		t.Fatalf("Get on a hung server failed after %v, beyond its timeout %v plus 5 s", took, timeout)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}

// TestWaitTimeoutUnacknowledged: when the server's host never acknowledged
// the WAIT (here: its window is full, as it is for a peer that is gone),
// the timed-out wait drops the connection without the CANCEL_WAIT
// exchange, whose bound (30 s here) would otherwise delay its error, and
// says why.
func TestWaitTimeoutUnacknowledged(t *testing.T) {
	addr := muteServer(t, false)
	c := dial(t, addr, ClientOptions{Timeout: 10 * time.Second, CancelTimeout: 30 * time.Second})
	cn, err := c.dial(context.Background(), opWait, nil, time.Now(), true)
	if err != nil {
		t.Fatal(err)
	}
	// Fill the window and the send buffer: writes block once the server's
	// receive queue is full.
	junk := make([]byte, 1<<20)
	_ = cn.nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
	for {
		if _, err := cn.nc.Write(junk); err != nil {
			break
		}
	}
	_ = cn.nc.SetWriteDeadline(time.Time{})
	if n, known := unacked(cn.nc); known && n == 0 {
		t.Fatalf("a connection whose peer stopped reading has nothing unacknowledged")
	} else if !known {
		t.Skip("this platform cannot tell unacknowledged bytes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.waitOn(ctx, cn, start, []string{"/k"})
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "never acknowledged") || !cn.broken {
		t.Fatalf("wait on an unacknowledging server: %v (broken %v); want ErrTimeout saying the request was never acknowledged, and the connection dropped", err, cn.broken)
	}
	if took > 10*time.Second {
		t.Fatalf("the wait failed after %v: it waited for the cancel exchange", took)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}

// TestUnacked: a healthy connection whose peer reads everything ends with
// nothing unacknowledged.
func TestUnacked(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, nc)
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if _, known := unacked(nc); !known {
		t.Skip("this platform cannot tell unacknowledged bytes")
	}
	waitFor(t, "the peer to acknowledge 64 KiB", func() bool { n, _ := unacked(nc); return n == 0 })
}
