package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// ClientOptions configure a TCPStore client. The zero value is usable.
type ClientOptions struct {
	// Timeout is the store timeout: it bounds connecting and every call
	// (default DefaultTimeout, 300 s). A context deadline shortens it.
	Timeout time.Duration
	// Dialect is the protocol numbering (default DialectV2, PyTorch ≥ 2.2).
	// Use DialectV1 against PyTorch 1.x/2.0 servers.
	Dialect Dialect
	// WorldSize, when > 0, makes the client announce itself with
	// ADD("init/", 1), as a PyTorch TCPStore with world_size and
	// wait_for_workers does; a PyTorch master that expects WorldSize
	// workers blocks until it sees them.
	WorldSize int
	// NoWaitForWorkers suppresses the "init/" announcement
	// (wait_for_workers=False).
	NoWaitForWorkers bool
	// Secret, when non-empty, runs the gocoll handshake (see ServerOptions).
	// When nil, GOCOLL_STORE_SECRET is read unless NoEnvSecret.
	Secret []byte
	// NoEnvSecret stops the client from reading GOCOLL_STORE_SECRET.
	NoEnvSecret bool
	// Backoff is the schedule of connect retries.
	Backoff Backoff
	// CancelTimeout bounds the CANCEL_WAIT exchange after a timed-out wait
	// (default 10 s); the connection is dropped when it expires.
	CancelTimeout time.Duration
}

func (o *ClientOptions) fill() error {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Dialect != DialectV1 && o.Dialect != DialectV2 {
		return fmt.Errorf("store: invalid dialect %d", int(o.Dialect))
	}
	if o.WorldSize < 0 {
		return fmt.Errorf("store: world size %d is negative", o.WorldSize)
	}
	if len(o.Secret) == 0 && !o.NoEnvSecret {
		if s := os.Getenv(SecretEnv); s != "" {
			o.Secret = []byte(s)
		}
	}
	o.Backoff.fill()
	if o.CancelTimeout <= 0 {
		o.CancelTimeout = 10 * time.Second
	}
	return nil
}

// TCPStore is a client of a TCPStore server (ours or PyTorch's). It is safe
// for concurrent use; calls on one TCPStore share one connection and run one
// at a time, as in PyTorch. Use Clone for a second connection.
//
// User keys are sent with PyTorch's "/" prefix, so Go and PyTorch clients of
// one server see the same keys.
type TCPStore struct {
	addr    string
	opts    ClientOptions
	timeout atomic.Int64
	server  *TCPServer // owned, from NewTCPStore with IsMaster

	mu     sync.Mutex
	nc     net.Conn
	br     *bufio.Reader
	wbuf   []byte
	closed bool
}

// DialTCPStore connects to the TCPStore server at addr ("host:port"),
// retrying with backoff until the store timeout or ctx's deadline, as
// PyTorch's client does. With opts.WorldSize > 0 it then announces itself
// under "init/".
func DialTCPStore(ctx context.Context, addr string, opts ClientOptions) (*TCPStore, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("store: bad address %q: %w", addr, err)
	}
	c := &TCPStore{addr: addr, opts: opts}
	c.timeout.Store(int64(opts.Timeout))
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.connectLocked(ctx); err != nil {
		return nil, err
	}
	if opts.WorldSize > 0 && !opts.NoWaitForWorkers {
		if _, err := c.addLocked(ctx, initKey, 1); err != nil {
			c.closeConnLocked()
			return nil, err
		}
	}
	return c, nil
}

// TCPStoreOptions configure NewTCPStore, PyTorch's TCPStore constructor.
type TCPStoreOptions struct {
	ClientOptions
	// IsMaster makes this store start the server on the address's port.
	IsMaster bool
	// Server configures the server of a master; its Addr defaults to
	// ":port" (every interface).
	Server ServerOptions
}

// NewTCPStore is PyTorch's TCPStore(host, port, world_size, is_master, …):
// with IsMaster it starts a TCPServer on the port of addr, then connects to
// addr as a client. A master with WorldSize > 0 (and wait-for-workers on)
// waits until WorldSize clients, itself included, have announced themselves.
// Closing the store closes the server it started.
func NewTCPStore(ctx context.Context, addr string, opts TCPStoreOptions) (*TCPStore, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("store: bad address %q: %w", addr, err)
	}
	var srv *TCPServer
	if opts.IsMaster {
		so := opts.Server
		if so.Addr == "" && so.Listener == nil {
			so.Addr = net.JoinHostPort("", port)
		}
		if len(so.Secret) == 0 {
			so.Secret = opts.Secret
		}
		so.NoEnvSecret = so.NoEnvSecret || opts.NoEnvSecret
		if srv, err = NewTCPServer(ctx, so); err != nil {
			return nil, err
		}
		addr = net.JoinHostPort(host, strconv.Itoa(srv.Port()))
	}
	c, err := DialTCPStore(ctx, addr, opts.ClientOptions)
	if err != nil {
		if srv != nil {
			_ = srv.Close()
		}
		return nil, err
	}
	c.server = srv
	if srv != nil && opts.WorldSize > 0 && !opts.NoWaitForWorkers {
		if err := c.WaitForWorkers(ctx, opts.WorldSize); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Addr returns the server address the client connects to.
func (c *TCPStore) Addr() string { return c.addr }

// Server returns the server this store started (NewTCPStore with IsMaster),
// or nil.
func (c *TCPStore) Server() *TCPServer { return c.server }

// deadline returns the earlier of ctx's deadline and now + store timeout.
func (c *TCPStore) deadline(ctx context.Context, start time.Time) time.Time {
	d := start.Add(c.Timeout())
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

// connectLocked dials, authenticates and validates until the deadline.
func (c *TCPStore) connectLocked(ctx context.Context) error {
	start := time.Now()
	deadline := c.deadline(ctx, start)
	delay := c.opts.Backoff.Initial
	var lastErr error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return c.errorf(opInvalid, nil, start, "connect cancelled after %d attempts (last error: %v): %w", attempt-1, lastErr, err)
		}
		nc, err := c.dialOnce(ctx, deadline)
		if err == nil {
			c.nc, c.br = nc, bufio.NewReaderSize(nc, 16<<10)
			return nil
		}
		lastErr = err
		if errors.Is(err, ErrAuth) {
			return c.errorf(opInvalid, nil, start, "connect: %w", err)
		}
		jit := 1 + c.opts.Backoff.Jitter*(2*rand.Float64()-1)
		sleep := time.Duration(float64(delay) * jit)
		delay = min(time.Duration(float64(delay)*c.opts.Backoff.Multiplier), c.opts.Backoff.Max)
		if time.Now().Add(sleep).After(deadline) {
			if ctx.Err() != nil {
				return c.errorf(opInvalid, nil, start, "connect failed after %d attempts (last error: %v): %w: %w", attempt, lastErr, ErrTimeout, ctx.Err())
			}
			return c.errorf(opInvalid, nil, start, "connect timed out after %d attempts (last error: %v): %w", attempt, lastErr, ErrTimeout)
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

// errorf builds an error naming the server, the operation, the keys and the
// elapsed time.
func (c *TCPStore) errorf(o op, keys []string, start time.Time, format string, args ...any) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "store: tcp %s", c.addr)
	if o != opInvalid {
		fmt.Fprintf(&sb, ": %s", o)
	}
	if len(keys) == 1 {
		fmt.Fprintf(&sb, " key %q", keys[0])
	} else if len(keys) > 1 {
		fmt.Fprintf(&sb, " keys %q", keys)
	}
	fmt.Fprintf(&sb, " (after %v): ", time.Since(start).Round(time.Millisecond))
	return fmt.Errorf(sb.String()+format, args...)
}

// call runs one exchange on the connection: it (re)connects when needed,
// sends req and runs read, all within the call's deadline. Any failure
// drops the connection, whose state is then unknown; the next call
// reconnects.
func (c *TCPStore) call(ctx context.Context, o op, keys []string, build func([]byte) []byte, read func(*reader) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callLocked(ctx, o, keys, build, read)
}

func (c *TCPStore) callLocked(ctx context.Context, o op, keys []string, build func([]byte) []byte, read func(*reader) error) error {
	start := time.Now()
	if c.closed {
		return c.errorf(o, keys, start, "%w", ErrClosed)
	}
	code, ok := encodeOp(c.opts.Dialect, o)
	if !ok {
		return c.errorf(o, keys, start, "%w: the %s dialect has no %s", ErrUnsupported, c.opts.Dialect, o)
	}
	if c.nc == nil {
		if err := c.connectLocked(ctx); err != nil {
			return err
		}
	}
	deadline := c.deadline(ctx, start)
	_ = c.nc.SetDeadline(deadline)
	stop := interruptOnDone(ctx, c.nc)
	c.wbuf = build(append(c.wbuf[:0], code))
	_, err := c.nc.Write(c.wbuf)
	if err == nil && read != nil {
		err = read(&reader{r: c.br})
	}
	stopped := stop()
	if err == nil && stopped {
		return nil
	}
	if err == nil {
		err = ctx.Err()
	}
	c.closeConnLocked()
	return c.wrapIOErr(ctx, o, keys, start, err)
}

func (c *TCPStore) wrapIOErr(ctx context.Context, o op, keys []string, start time.Time, err error) error {
	var ne net.Error
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return c.errorf(o, keys, start, "%w: %w", ErrTimeout, ctx.Err())
	case ctx.Err() != nil:
		return c.errorf(o, keys, start, "%w", ctx.Err())
	case errors.As(err, &ne) && ne.Timeout() && ctxDeadlineFirst(ctx, c.deadline(ctx, start)):
		return c.errorf(o, keys, start, "%w: %w", ErrTimeout, context.DeadlineExceeded)
	case errors.As(err, &ne) && ne.Timeout():
		return c.errorf(o, keys, start, "%w after the store timeout %v", ErrTimeout, c.Timeout())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return c.errorf(o, keys, start, "the server closed the connection (server shut down, or it rejected the request): %w: %w", ErrClosed, err)
	case errors.Is(err, errMalformed):
		return c.errorf(o, keys, start, "bad reply: %w", err)
	}
	return c.errorf(o, keys, start, "%w", err)
}

// interruptOnDone makes a blocked read or write on nc fail when ctx ends.
// The returned stop reports whether ctx did not interrupt; once it returns,
// the interruption is over and nc's deadline may be set again.
func interruptOnDone(ctx context.Context, nc net.Conn) (stop func() bool) {
	done := make(chan struct{})
	af := context.AfterFunc(ctx, func() {
		_ = nc.SetDeadline(time.Unix(1, 0))
		close(done)
	})
	var once sync.Once
	var notInterrupted bool
	return func() bool {
		once.Do(func() {
			if notInterrupted = af(); !notInterrupted {
				<-done
			}
		})
		return notInterrupted
	}
}

// ctxDeadlineFirst reports whether the call's deadline is ctx's own.
func ctxDeadlineFirst(ctx context.Context, deadline time.Time) bool {
	d, ok := ctx.Deadline()
	return ok && !d.After(deadline)
}

func (c *TCPStore) closeConnLocked() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc, c.br = nil, nil
	}
}

// waitLocked sends WAIT for raw keys and waits for STOP_WAITING until the
// deadline; on timeout it cancels the wait with CANCEL_WAIT (DialectV2) or
// drops the connection (DialectV1, which has no cancel).
func (c *TCPStore) waitLocked(ctx context.Context, start time.Time, keys []string) error {
	if c.closed {
		return c.errorf(opWait, keys, start, "%w", ErrClosed)
	}
	if c.nc == nil {
		if err := c.connectLocked(ctx); err != nil {
			return err
		}
	}
	code, _ := encodeOp(c.opts.Dialect, opWait)
	b := appendU64(append(c.wbuf[:0], code), uint64(len(keys)))
	for _, k := range keys {
		b = appendStr(b, k)
	}
	c.wbuf = b
	deadline := c.deadline(ctx, start)
	_ = c.nc.SetDeadline(deadline)
	stop := interruptOnDone(ctx, c.nc)
	_, err := c.nc.Write(b)
	var r byte
	if err == nil {
		r, err = c.br.ReadByte()
	}
	stopped := stop()
	if err == nil && stopped {
		if r != replyStopWait {
			c.closeConnLocked()
			return c.errorf(opWait, keys, start, "%w: WAIT reply %d, want STOP_WAITING", errMalformed, r)
		}
		return nil
	}
	if err == nil {
		// The reply came, but ctx was cancelled meanwhile: honour the reply.
		if r == replyStopWait {
			return nil
		}
		err = ctx.Err()
	}
	var ne net.Error
	timedOut := (errors.As(err, &ne) && ne.Timeout()) || ctx.Err() != nil
	if !timedOut {
		c.closeConnLocked()
		return c.wrapIOErr(ctx, opWait, keys, start, err)
	}
	elapsed := time.Since(start)
	if c.opts.Dialect == DialectV2 && c.cancelWaitLocked() == nil {
		// connection still usable
	} else {
		c.closeConnLocked()
	}
	msg := fmt.Sprintf("wait timeout after %dms, keys: %s", elapsed.Milliseconds(), strings.Join(keys, ", "))
	switch {
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return c.errorf(opWait, keys, start, "%s: %w", msg, ctx.Err())
	case ctxDeadlineFirst(ctx, deadline):
		return c.errorf(opWait, keys, start, "%s: %w: %w", msg, ErrTimeout, context.DeadlineExceeded)
	}
	return c.errorf(opWait, keys, start, "%s: %w", msg, ErrTimeout)
}

// cancelWaitLocked sends CANCEL_WAIT and reads its reply, after a possible
// STOP_WAITING that crossed it.
func (c *TCPStore) cancelWaitLocked() error {
	_ = c.nc.SetDeadline(time.Now().Add(c.opts.CancelTimeout))
	defer func() {
		if c.nc != nil {
			_ = c.nc.SetDeadline(time.Time{})
		}
	}()
	code, _ := encodeOp(DialectV2, opCancelWait)
	if _, err := c.nc.Write([]byte{code}); err != nil {
		return err
	}
	r, err := c.br.ReadByte()
	if err != nil {
		return err
	}
	if r == replyStopWait {
		if r, err = c.br.ReadByte(); err != nil {
			return err
		}
	}
	if r != replyWaitCancel {
		return fmt.Errorf("%w: CANCEL_WAIT reply %d", errMalformed, r)
	}
	return nil
}

func wireKey(k string) string { return keyPrefix + k }

func wireKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = keyPrefix + k
	}
	return out
}

func readValue(r *reader, dst *[]byte) error {
	b, err := r.bytes("value", 1<<40)
	*dst = b
	return err
}

func readI64(r *reader, dst *int64) error {
	v, err := r.u64()
	*dst = int64(v) //nolint:gosec
	return err
}

// Set implements Store.
func (c *TCPStore) Set(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	return c.call(ctx, opSet, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
}

// Get implements Store: WAIT, then GET, as PyTorch's client.
func (c *TCPStore) Get(ctx context.Context, key string) ([]byte, error) {
	return c.getRaw(ctx, wireKey(key))
}

func (c *TCPStore) getRaw(ctx context.Context, k string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	if err := c.waitLocked(ctx, start, []string{k}); err != nil {
		return nil, err
	}
	var v []byte
	err := c.callLocked(ctx, opGet, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readValue(r, &v) })
	return v, err
}

// Add implements Store.
func (c *TCPStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addLocked(ctx, wireKey(key), delta)
}

func (c *TCPStore) addLocked(ctx context.Context, k string, delta int64) (int64, error) {
	var n int64
	err := c.callLocked(ctx, opAdd, []string{k}, func(b []byte) []byte { return appendI64(appendStr(b, k), delta) },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// CompareSet implements Store.
func (c *TCPStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k := wireKey(key)
	var v []byte
	err := c.call(ctx, opCompareSet, []string{k},
		func(b []byte) []byte { return appendStr(appendStr(appendStr(b, k), expected), desired) },
		func(r *reader) error { return readValue(r, &v) })
	return v, err
}

// Check implements Store.
func (c *TCPStore) Check(ctx context.Context, keys ...string) (bool, error) {
	wk := wireKeys(keys)
	var r byte
	err := c.call(ctx, opCheck, wk, func(b []byte) []byte {
		b = appendU64(b, uint64(len(wk)))
		for _, k := range wk {
			b = appendStr(b, k)
		}
		return b
	}, func(rd *reader) (err error) { r, err = rd.u8(); return err })
	if err != nil {
		return false, err
	}
	if r != replyReady && r != replyNotReady {
		return false, fmt.Errorf("store: tcp %s: CHECK: %w: reply %d", c.addr, errMalformed, r)
	}
	return r == replyReady, nil
}

// Wait implements Store. On timeout it cancels the server-side wait, so
// the client stays usable.
func (c *TCPStore) Wait(ctx context.Context, keys ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waitLocked(ctx, time.Now(), wireKeys(keys))
}

// DeleteKey implements Store.
func (c *TCPStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	k := wireKey(key)
	var n int64
	err := c.call(ctx, opDeleteKey, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readI64(r, &n) })
	return n == 1, err
}

// NumKeys implements Store. As in PyTorch it counts every key on the
// server, the internal "init/" included, and not the queues.
func (c *TCPStore) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := c.call(ctx, opNumKeys, nil, func(b []byte) []byte { return b },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// Append implements Store. DialectV1 has no APPEND; it is emulated with
// COMPARE_SET, as PyTorch's fallback does.
func (c *TCPStore) Append(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	if c.opts.Dialect == DialectV2 {
		return c.call(ctx, opAppend, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
	}
	for {
		var cur []byte
		ok, err := c.Check(ctx, key)
		if err != nil {
			return err
		}
		if ok {
			if cur, err = c.Get(ctx, key); err != nil {
				return err
			}
		}
		want := append(bytes.Clone(cur), value...)
		got, err := c.CompareSet(ctx, key, cur, want)
		if err != nil {
			return err
		}
		if bytes.Equal(got, want) {
			return nil
		}
	}
}

// MultiGet implements Store: WAIT for all keys, then MULTI_GET (one GET per
// key in DialectV1).
func (c *TCPStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	if c.opts.Dialect == DialectV1 {
		out := make([][]byte, len(keys))
		for i, k := range keys {
			v, err := c.Get(ctx, k)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	wk := wireKeys(keys)
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	if err := c.waitLocked(ctx, start, wk); err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	err := c.callLocked(ctx, opMultiGet, wk, func(b []byte) []byte {
		b = appendU64(b, uint64(len(wk)))
		for _, k := range wk {
			b = appendStr(b, k)
		}
		return b
	}, func(r *reader) error {
		for i := range out {
			if err := readValue(r, &out[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MultiSet implements Store (one SET per key in DialectV1).
func (c *TCPStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("store: tcp %s: MULTI_SET of %d keys with %d values", c.addr, len(keys), len(values))
	}
	if c.opts.Dialect == DialectV1 {
		for i, k := range keys {
			if err := c.Set(ctx, k, values[i]); err != nil {
				return err
			}
		}
		return nil
	}
	wk := wireKeys(keys)
	return c.call(ctx, opMultiSet, wk, func(b []byte) []byte {
		b = appendU64(b, uint64(len(wk)))
		for i, k := range wk {
			b = appendStr(appendStr(b, k), values[i])
		}
		return b
	}, nil)
}

// QueuePush implements Store (DialectV2 servers with queues: ours, and
// PyTorch's libuv server).
func (c *TCPStore) QueuePush(ctx context.Context, key string, value []byte) error {
	k := wireKey(key)
	return c.call(ctx, opQueuePush, []string{k}, func(b []byte) []byte { return appendStr(appendStr(b, k), value) }, nil)
}

// QueuePop implements Store. A blocking pop waits for the key, then pops,
// and waits again if another client took the item first.
func (c *TCPStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	k := wireKey(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	for {
		if block {
			if err := c.waitLocked(ctx, start, []string{k}); err != nil {
				return nil, err
			}
		}
		var n int64
		var v []byte
		err := c.callLocked(ctx, opQueuePop, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
			func(r *reader) error {
				if err := readI64(r, &n); err != nil || n <= 0 {
					return err
				}
				return readValue(r, &v)
			})
		if err != nil {
			return nil, err
		}
		if n > 0 {
			return v, nil
		}
		if !block {
			return nil, c.errorf(opQueuePop, []string{k}, start, "%w", ErrQueueEmpty)
		}
	}
}

// QueueLen implements Store.
func (c *TCPStore) QueueLen(ctx context.Context, key string) (int64, error) {
	k := wireKey(key)
	var n int64
	err := c.call(ctx, opQueueLen, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readI64(r, &n) })
	return n, err
}

// ListKeys implements Store: the user keys, without PyTorch's "/" prefix
// and without internal keys such as "init/", sorted.
func (c *TCPStore) ListKeys(ctx context.Context) ([]string, error) {
	var keys []string
	err := c.call(ctx, opListKeys, nil, func(b []byte) []byte { return b }, func(r *reader) error {
		var n int64
		if err := readI64(r, &n); err != nil {
			return err
		}
		if n < 0 || n > 1<<32 {
			return fmt.Errorf("%w: LIST_KEYS count %d", errMalformed, n)
		}
		for range n {
			var k []byte
			if err := readValue(r, &k); err != nil {
				return err
			}
			if s, ok := strings.CutPrefix(string(k), keyPrefix); ok {
				keys = append(keys, s)
			}
		}
		return nil
	})
	slices.Sort(keys)
	return keys, err
}

// SetTimeout implements Store.
func (c *TCPStore) SetTimeout(d time.Duration) { c.timeout.Store(int64(d)) }

// Timeout implements Store.
func (c *TCPStore) Timeout() time.Duration { return time.Duration(c.timeout.Load()) }

// Clone implements Store: a new connection to the same server, with the
// same options and timeout, that does not announce itself under "init/".
func (c *TCPStore) Clone() (Store, error) {
	o := c.opts
	o.Timeout = c.Timeout()
	o.NoWaitForWorkers = true
	return DialTCPStore(context.Background(), c.addr, o)
}

// WaitForWorkers blocks until n clients have announced themselves under
// "init/" (PyTorch's wait_for_workers on the master), polling every 10 ms.
func (c *TCPStore) WaitForWorkers(ctx context.Context, n int) error {
	start := time.Now()
	deadline := c.deadline(ctx, start)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var joined int64
	for {
		v, err := c.getRaw(dctx, initKey)
		if err == nil {
			joined, err = parseStoll(v)
		}
		if err == nil && joined >= int64(n) {
			return nil
		}
		if err != nil && !errors.Is(err, ErrTimeout) {
			return err
		}
		if err != nil || time.Now().After(deadline) {
			return c.errorf(opInvalid, []string{initKey}, start, "timed out after %d seconds waiting for clients. %d/%d clients joined: %w",
				int(time.Since(start).Seconds()), joined, n, ErrTimeout)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-dctx.Done():
		}
	}
}

// Close implements Store: it closes the connection and, for a master from
// NewTCPStore, the server.
func (c *TCPStore) Close() error {
	c.mu.Lock()
	c.closed = true
	c.closeConnLocked()
	c.mu.Unlock()
	if c.server != nil {
		return c.server.Close()
	}
	return nil
}
