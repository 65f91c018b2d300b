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

// maxIdleConns bounds the idle wait connections a TCPStore keeps; one given
// back beyond it is closed.
const maxIdleConns = 4

// TCPStore is a client of a TCPStore server (ours or PyTorch's). It is safe
// for concurrent use.
//
// Every call that cannot block indefinitely (Set, Add, CompareSet, Check,
// DeleteKey, NumKeys, Append, MultiSet, QueuePush, QueueLen, ListKeys, a
// non-blocking QueuePop, and the GET step of Get and MultiGet) runs on one
// main connection, one call at a time, as in PyTorch's client. The server
// applies a connection's requests in order, so such a call sees the effect
// of every call of the same TCPStore that returned before it started, a SET
// (which has no reply) included.
//
// Only the calls that wait for another party (the WAIT of Wait, Get and
// MultiGet, and a blocking QueuePop) run on a wait connection, taken from a
// small idle list or dialled when none is idle; at most maxIdleConns (4)
// idle ones are kept. PyTorch's client waits on its single connection, so a
// blocked Get stalls every other call of the client, even the Set, from
// another thread, that would wake it; here a blocked wait holds only its
// own connection. Get and MultiGet wait on a wait connection, then read on
// the main connection, so they return what the caller's earlier Sets wrote.
// (A WAIT only waits for keys to exist: one that the server takes before an
// earlier SET of the caller returns once that SET lands.) A connection that
// fails is closed, its state being unknown; a later call dials anew.
//
// Sequential calls from one goroutine send PyTorch's client's requests:
// the WAITs (and CANCEL_WAITs) on a wait connection, the rest on the main one.
//
// User keys are sent with PyTorch's "/" prefix, so Go and PyTorch clients of
// one server see the same keys.
type TCPStore struct {
	addr string
	opts ClientOptions
	timeoutSetting
	server *TCPServer // owned, from NewTCPStore with IsMaster

	// life ends at Close; it stops dials.
	life context.Context
	kill context.CancelFunc

	// mu serialises the calls on the main connection; main is nil when it
	// must be dialled anew.
	mu   sync.Mutex
	main *tcpConn

	// cmu guards the fields below.
	cmu    sync.Mutex
	conns  map[*tcpConn]struct{} // every open connection: main, waits idle or in use
	idle   []*tcpConn            // the idle wait connections
	closed bool
}

// tcpConn is one connection of a TCPStore, used by one call at a time.
type tcpConn struct {
	nc     net.Conn
	br     *bufio.Reader
	wbuf   []byte
	wait   bool // a wait connection (set before it is shared)
	broken bool // its state is unknown after a failure: drop it
}

// DialTCPStore connects to the TCPStore server at addr ("host:port"),
// retrying with backoff until the store timeout or ctx's deadline, as
// PyTorch's client does. With opts.WorldSize > 0 it then announces itself
// under "init/" (once per TCPStore: wait connections do not repeat it).
func DialTCPStore(ctx context.Context, addr string, opts ClientOptions) (*TCPStore, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("store: bad address %q: %w", addr, err)
	}
	c := &TCPStore{addr: addr, opts: opts, conns: map[*tcpConn]struct{}{}}
	c.SetTimeout(opts.Timeout)
	c.life, c.kill = context.WithCancel(context.Background())
	cn, err := c.dial(ctx, opInvalid, nil, time.Now(), false)
	if err != nil {
		c.kill()
		return nil, err
	}
	c.main = cn
	if opts.WorldSize > 0 && !opts.NoWaitForWorkers {
		if _, err := c.add(ctx, initKey, 1); err != nil {
			_ = c.Close()
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

// drop closes cn and forgets it.
func (c *TCPStore) drop(cn *tcpConn) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	_ = cn.nc.Close()
	delete(c.conns, cn)
}

func (c *TCPStore) isClosed() bool {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return c.closed
}

// call runs one request on the main connection and reads its reply (none
// when read is nil), within the call's deadline. A failure drops the
// connection, whose state is then unknown; the next call dials anew.
func (c *TCPStore) call(ctx context.Context, o op, keys []string, build func([]byte) []byte, read func(*reader) error) error {
	start := time.Now()
	code, ok := encodeOp(c.opts.Dialect, o)
	if !ok {
		return c.errorf(o, keys, start, "%w: the %s dialect has no %s", ErrUnsupported, c.opts.Dialect, o)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed() {
		return c.errorf(o, keys, start, "%w", ErrClosed)
	}
	if c.main == nil {
		cn, err := c.dial(ctx, o, keys, start, false)
		if err != nil {
			return err
		}
		c.main = cn
	}
	err := c.roundTrip(ctx, c.main, o, keys, start, code, build, read)
	if c.main.broken {
		c.drop(c.main)
		c.main = nil
	}
	return err
}

// roundTrip sends one request on cn and reads its reply (none when read is
// nil), all before the call's deadline. A failure marks cn broken.
func (c *TCPStore) roundTrip(ctx context.Context, cn *tcpConn, o op, keys []string, start time.Time, code byte, build func([]byte) []byte, read func(*reader) error) error {
	_ = cn.nc.SetDeadline(c.deadline(ctx, start))
	stop := interruptOnDone(ctx, cn.nc)
	cn.wbuf = build(append(cn.wbuf[:0], code))
	_, err := cn.nc.Write(cn.wbuf)
	if err == nil && read != nil {
		err = read(&reader{r: cn.br})
	}
	stopped := stop()
	if err == nil && stopped {
		return nil
	}
	if err == nil {
		err = ctx.Err()
	}
	cn.broken = true
	return c.wrapIOErr(ctx, o, keys, start, err)
}

// withWaitConn runs fn on a wait connection: an idle one, or a new one when
// none is idle. It then gives the connection back to the idle list, or
// closes it when it is broken, when the store is closed or when
// maxIdleConns are idle already.
func (c *TCPStore) withWaitConn(ctx context.Context, o op, keys []string, start time.Time, fn func(*tcpConn) error) error {
	c.cmu.Lock()
	if c.closed {
		c.cmu.Unlock()
		return c.errorf(o, keys, start, "%w", ErrClosed)
	}
	var cn *tcpConn
	if n := len(c.idle); n > 0 {
		cn = c.idle[n-1]
		c.idle = c.idle[:n-1]
	}
	c.cmu.Unlock()
	if cn == nil {
		var err error
		if cn, err = c.dial(ctx, o, keys, start, true); err != nil {
			return err
		}
	}
	err := fn(cn)
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if cn.broken || c.closed || len(c.idle) >= maxIdleConns {
		_ = cn.nc.Close()
		delete(c.conns, cn)
	} else {
		c.idle = append(c.idle, cn)
	}
	return err
}

// waitConns returns the number of open wait connections and of idle ones
// (for tests).
func (c *TCPStore) waitConns() (open, idle int) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	for cn := range c.conns {
		if cn.wait {
			open++
		}
	}
	return open, len(c.idle)
}

func (c *TCPStore) wrapIOErr(ctx context.Context, o op, keys []string, start time.Time, err error) error {
	var ne net.Error
	switch {
	case c.isClosed():
		return c.errorf(o, keys, start, "the client was closed during the call: %w", ErrClosed)
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

// wait runs a WAIT for raw keys on a wait connection.
func (c *TCPStore) wait(ctx context.Context, start time.Time, keys []string) error {
	return c.withWaitConn(ctx, opWait, keys, start, func(cn *tcpConn) error {
		return c.waitOn(ctx, cn, start, keys)
	})
}

// waitOn sends WAIT for raw keys on cn and waits for STOP_WAITING until the
// deadline; on timeout it cancels the wait with CANCEL_WAIT (DialectV2) or
// drops the connection (DialectV1, which has no cancel).
func (c *TCPStore) waitOn(ctx context.Context, cn *tcpConn, start time.Time, keys []string) error {
	code, _ := encodeOp(c.opts.Dialect, opWait)
	b := appendU64(append(cn.wbuf[:0], code), uint64(len(keys)))
	for _, k := range keys {
		b = appendStr(b, k)
	}
	cn.wbuf = b
	deadline := c.deadline(ctx, start)
	_ = cn.nc.SetDeadline(deadline)
	stop := interruptOnDone(ctx, cn.nc)
	_, err := cn.nc.Write(b)
	var r byte
	if err == nil {
		r, err = cn.br.ReadByte()
	}
	stopped := stop()
	if err == nil && (stopped || r == replyStopWait) {
		// A reply, even one that came as ctx ended: honour it.
		if r != replyStopWait {
			cn.broken = true
			return c.errorf(opWait, keys, start, "%w: WAIT reply %d, want STOP_WAITING", errMalformed, r)
		}
		return nil
	}
	if err == nil {
		err = ctx.Err()
	}
	var ne net.Error
	timedOut := (errors.As(err, &ne) && ne.Timeout()) || ctx.Err() != nil
	if !timedOut || c.isClosed() {
		cn.broken = true
		return c.wrapIOErr(ctx, opWait, keys, start, err)
	}
	elapsed := time.Since(start)
	if c.opts.Dialect != DialectV2 || c.cancelWait(cn) != nil {
		cn.broken = true
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

// cancelWait sends CANCEL_WAIT on cn and reads its reply, after a possible
// STOP_WAITING that crossed it.
func (c *TCPStore) cancelWait(cn *tcpConn) error {
	_ = cn.nc.SetDeadline(time.Now().Add(c.opts.CancelTimeout))
	defer func() { _ = cn.nc.SetDeadline(time.Time{}) }()
	code, _ := encodeOp(DialectV2, opCancelWait)
	if _, err := cn.nc.Write([]byte{code}); err != nil {
		return err
	}
	r, err := cn.br.ReadByte()
	if err != nil {
		return err
	}
	if r == replyStopWait {
		if r, err = cn.br.ReadByte(); err != nil {
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

// Get implements Store: WAIT, as PyTorch's client, on a wait connection,
// then GET on the main connection.
func (c *TCPStore) Get(ctx context.Context, key string) ([]byte, error) {
	return c.getRaw(ctx, wireKey(key))
}

func (c *TCPStore) getRaw(ctx context.Context, k string) ([]byte, error) {
	if err := c.wait(ctx, time.Now(), []string{k}); err != nil {
		return nil, err
	}
	var v []byte
	err := c.call(ctx, opGet, []string{k}, func(b []byte) []byte { return appendStr(b, k) },
		func(r *reader) error { return readValue(r, &v) })
	return v, err
}

// Add implements Store.
func (c *TCPStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	return c.add(ctx, wireKey(key), delta)
}

func (c *TCPStore) add(ctx context.Context, k string, delta int64) (int64, error) {
	var n int64
	err := c.call(ctx, opAdd, []string{k}, func(b []byte) []byte { return appendI64(appendStr(b, k), delta) },
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

// Wait implements Store, on a wait connection. On timeout it cancels the
// server-side wait, so the connection stays usable.
func (c *TCPStore) Wait(ctx context.Context, keys ...string) error {
	return c.wait(ctx, time.Now(), wireKeys(keys))
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

// MultiGet implements Store: WAIT for all keys on a wait connection, then
// MULTI_GET on the main connection (one Get per key in DialectV1).
func (c *TCPStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	if c.opts.Dialect == DialectV1 {
		return getEach(ctx, c.Get, keys)
	}
	wk := wireKeys(keys)
	if err := c.wait(ctx, time.Now(), wk); err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	err := c.call(ctx, opMultiGet, wk, func(b []byte) []byte {
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

// QueuePop implements Store. A non-blocking pop runs on the main
// connection. A blocking one runs on a wait connection: it waits for the
// key, then pops, and waits again if another client took the item first.
func (c *TCPStore) QueuePop(ctx context.Context, key string, block bool) ([]byte, error) {
	k := wireKey(key)
	keys := []string{k}
	var n int64
	var v []byte
	build := func(b []byte) []byte { return appendStr(b, k) }
	read := func(r *reader) error {
		if err := readI64(r, &n); err != nil || n <= 0 {
			return err
		}
		return readValue(r, &v)
	}
	start := time.Now()
	if !block {
		if err := c.call(ctx, opQueuePop, keys, build, read); err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, c.errorf(opQueuePop, keys, start, "%w", ErrQueueEmpty)
		}
		return v, nil
	}
	code, ok := encodeOp(c.opts.Dialect, opQueuePop)
	if !ok {
		return nil, c.errorf(opQueuePop, keys, start, "%w: the %s dialect has no %s", ErrUnsupported, c.opts.Dialect, opQueuePop)
	}
	err := c.withWaitConn(ctx, opQueuePop, keys, start, func(cn *tcpConn) error {
		for n <= 0 {
			if err := c.waitOn(ctx, cn, start, keys); err != nil {
				return err
			}
			if err := c.roundTrip(ctx, cn, opQueuePop, keys, start, code, build, read); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
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

// Clone implements Store: an independent TCPStore (its own connections) on
// the same server, with the same options and timeout, that does not
// announce itself under "init/".
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

// Close implements Store: it closes every connection, the main one and the
// wait ones, idle or in use, so that calls in flight fail at once with
// ErrClosed, and, for a master from NewTCPStore, the server.
func (c *TCPStore) Close() error {
	c.cmu.Lock()
	if !c.closed {
		c.closed = true
		c.kill()
		for cn := range c.conns {
			_ = cn.nc.Close()
		}
		clear(c.conns)
		c.idle = nil
	}
	c.cmu.Unlock()
	if c.server != nil {
		return c.server.Close()
	}
	return nil
}
