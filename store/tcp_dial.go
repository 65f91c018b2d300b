package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"time"
)

// Backoff is the retry schedule of connection attempts: exponential with
// jitter, as PyTorch's ExponentialBackoffWithJitter.
type Backoff struct {
	// Initial is the first delay (default 500 ms).
	Initial time.Duration
	// Max caps the delay (default 60 s).
	Max time.Duration
	// Multiplier grows the delay after each try (default 1.5).
	Multiplier float64
	// Jitter is the relative randomisation, delay × (1 ± Jitter) (default 0.5).
	Jitter float64
}

func (b *Backoff) fill() {
	if b.Initial <= 0 {
		b.Initial = 500 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 60 * time.Second
	}
	if b.Multiplier < 1 {
		b.Multiplier = 1.5
	}
	if b.Jitter <= 0 || b.Jitter > 1 {
		b.Jitter = 0.5
	}
}

// connect dials, authenticates and validates a connection, retrying until
// the deadline.
func (c *TCPStore) connect(ctx context.Context) (*tcpConn, error) {
	start := time.Now()
	deadline := c.deadline(ctx, start)
	delay := c.opts.Backoff.Initial
	var lastErr error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, c.errorf(opInvalid, nil, start, "connect cancelled after %d attempts (last error: %v): %w", attempt-1, lastErr, err)
		}
		nc, err := c.dialOnce(ctx, deadline)
		if err == nil {
			return &tcpConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10)}, nil
		}
		lastErr = err
		if errors.Is(err, ErrAuth) {
			return nil, c.errorf(opInvalid, nil, start, "connect: %w", err)
		}
		jit := 1 + c.opts.Backoff.Jitter*(2*rand.Float64()-1)
		sleep := time.Duration(float64(delay) * jit)
		delay = min(time.Duration(float64(delay)*c.opts.Backoff.Multiplier), c.opts.Backoff.Max)
		if time.Now().Add(sleep).After(deadline) {
			if ctx.Err() != nil {
				return nil, c.errorf(opInvalid, nil, start, "connect failed after %d attempts (last error: %v): %w: %w", attempt, lastErr, ErrTimeout, ctx.Err())
			}
			return nil, c.errorf(opInvalid, nil, start, "connect timed out after %d attempts (last error: %v): %w", attempt, lastErr, ErrTimeout)
		}
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// dialOnce makes one connection attempt with the handshakes.
func (c *TCPStore) dialOnce(ctx context.Context, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{Deadline: deadline}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = nc.SetDeadline(deadline)
	stop := interruptOnDone(ctx, nc)
	defer stop()
	fail := func(err error) (net.Conn, error) {
		_ = nc.Close()
		return nil, err
	}
	if len(c.opts.Secret) > 0 {
		if err := clientAuth(nc, c.opts.Secret); err != nil {
			return fail(err)
		}
	}
	if c.opts.Dialect == DialectV2 {
		nonce := uint32(os.Getpid())
		b := appendU32([]byte{0}, validationMagic)
		b = append(b, 13) // PING
		b = appendU32(b, nonce)
		if _, err := nc.Write(b); err != nil {
			return fail(fmt.Errorf("send VALIDATE+PING: %w", err))
		}
		var r [4]byte
		if _, err := io.ReadFull(nc, r[:]); err != nil {
			return fail(fmt.Errorf("read PING reply (a 1.x server, or one that refuses this client?): %w", err))
		}
		if string(r[:]) == authRefused[:4] {
			return fail(fmt.Errorf("%w: the server demands the store's shared secret (set %s or ClientOptions.Secret)", ErrAuth, SecretEnv))
		}
		if got := uint32(r[0]) | uint32(r[1])<<8 | uint32(r[2])<<16 | uint32(r[3])<<24; got != nonce {
			return fail(fmt.Errorf("ping failed: the server returned %#x for nonce %#x", got, nonce))
		}
	}
	if !stop() {
		return fail(ctx.Err())
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// dial connects a new connection of the store, the main one or a wait one;
// Close stops it.
func (c *TCPStore) dial(ctx context.Context, o op, keys []string, start time.Time, wait bool) (*tcpConn, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.life, cancel)()
	cn, err := c.connect(dctx)
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if c.closed {
		if cn != nil {
			_ = cn.nc.Close()
		}
		return nil, c.errorf(o, keys, start, "%w", ErrClosed)
	}
	if err != nil {
		return nil, err
	}
	cn.wait = wait
	c.conns[cn] = struct{}{}
	return cn, nil
}
