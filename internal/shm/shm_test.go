package shm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

func pair(t testing.TB, ring int) (*Pair, *Pair) {
	t.Helper()
	a, path, err := Create("gocoll-test-", ring)
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file left behind: %v", err)
	}
	t.Cleanup(func() { a.Close(); b.Close(); _ = a.Unmap(); _ = b.Unmap() })
	return a, b
}

// TestStream sends frames of random sizes, some larger than the ring, in
// both directions at once, and checks every byte.
func TestStream(t *testing.T) {
	a, b := pair(t, 1<<12)
	ctx := context.Background()
	for _, dir := range [][2]*Pair{{a, b}, {b, a}} {
		go func(w *Pair) {
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 300; i++ {
				p := make([]byte, rng.IntN(10000))
				for j := range p {
					p[j] = byte(i + j)
				}
				h := []byte{byte(i), byte(len(p)), byte(len(p) >> 8)}
				if err := w.Out.Write(ctx, h, p, 0); err != nil {
					panic(err)
				}
			}
		}(dir[0])
	}
	for _, r := range []*Pair{a, b} {
		for i := 0; i < 300; i++ {
			var h [3]byte
			if _, err := io.ReadFull(r.In, h[:]); err != nil {
				t.Fatal(err)
			}
			n := int(h[1]) | int(h[2])<<8
			p := make([]byte, n)
			if _, err := io.ReadFull(r.In, p); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, n)
			for j := range want {
				want[j] = byte(i + j)
			}
			if h[0] != byte(i) || !bytes.Equal(p, want) {
				t.Fatalf("frame %d corrupt", i)
			}
		}
	}
}

// TestDeadAndClosed: bytes written before the peer died are still read;
// then reads fail; Close unblocks a sleeping reader.
func TestDeadAndClosed(t *testing.T) {
	a, b := pair(t, 1<<12)
	if err := a.Out.Write(context.Background(), []byte("hi"), nil, 0); err != nil {
		t.Fatal(err)
	}
	b.MarkDead()
	var p [2]byte
	if _, err := io.ReadFull(b.In, p[:]); err != nil || string(p[:]) != "hi" {
		t.Fatalf("%q %v", p, err)
	}
	if _, err := b.In.Read(p[:]); !errors.Is(err, ErrPeerDead) {
		t.Fatalf("want ErrPeerDead, got %v", err)
	}
	done := make(chan error)
	go func() { _, err := a.In.Read(p[:]); done <- err }()
	time.Sleep(50 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("want ErrClosed, got %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not unblock the reader")
	}
}

func BenchmarkPingPong8(b *testing.B) {
	x, y := pair(b, 1<<16)
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var buf [8]byte
		for {
			if _, err := io.ReadFull(y.In, buf[:]); err != nil {
				return
			}
			if err := y.Out.Write(ctx, buf[:], nil, 0); err != nil {
				return
			}
		}
	}()
	var buf [8]byte
	b.ReportAllocs()
	for b.Loop() {
		if err := x.Out.Write(ctx, buf[:], nil, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(x.In, buf[:]); err != nil {
			b.Fatal(err)
		}
	}
	// The echo goroutine must be out of the rings before Cleanup unmaps them.
	x.Close()
	y.Close()
	<-done
}
