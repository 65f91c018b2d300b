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

// maxIdleConns bounds the idle connections a TCPStore keeps for later
// calls; one returned beyond it is closed. (An idle connection whose last
// write awaits confirmation is kept beyond it until the next call confirms
// that write.)
const maxIdleConns = 4

// TCPStore is a client of a TCPStore server (ours or PyTorch's). It is safe
// for concurrent use. Where PyTorch's client runs every call on one
// connection, one at a time, a TCPStore keeps a small pool of connections:
// a call takes an idle one (or dials a new one) and gives it back when it
// returns, so concurrent calls never wait behind each other. A blocked Get,
// Wait or QueuePop occupies only its own connection, and other goroutines,
// the one that will set the awaited key among them, carry on meanwhile. At
// most maxIdleConns (4) idle connections are kept; a connection that fails
// is closed, and a later call dials anew.
//
// Calls keep the order of a single connection: a call sees the effect of
// every call of the same TCPStore that returned before it started, even of
// a SET, which has no reply. (A call that finds such a write unconfirmed on
// another connection first confirms it there with a GETNUMKEYS round trip,
// or, when that connection is in a wait, by CANCEL_WAIT and WAIT again.)
// Sequential calls from one goroutine run on one connection and send the
// same bytes as PyTorch's client.
//
// User keys are sent with PyTorch's "/" prefix, so Go and PyTorch clients of
// one server see the same keys.
type TCPStore struct {
	addr    string
	opts    ClientOptions
	timeout atomic.Int64
	server  *TCPServer // owned, from NewTCPStore with IsMaster

	// life ends at Close; it stops dials and waits for other connections.
	life context.Context
	kill context.CancelFunc

	mu       sync.Mutex
	conns    map[*tcpConn]struct{} // every open connection, idle or in use
	idle     []*tcpConn            // the idle ones, most recently used last
	wseq     uint64                // numbers the reply-less writes (tcpConn.pending)
	ndirty   int                   // connections with pending != 0
	changed  chan struct{}         // closed and replaced, when watched, as a connection is given back, confirmed or dropped
	watchers int                   // calls of acquire that watch changed
	closed   bool
}

// tcpConn is one connection of a TCPStore.
type tcpConn struct {
	nc   net.Conn
	br   *bufio.Reader
	wbuf []byte

	// Owned by the call that holds the connection.
	dirty  bool // a reply-less request was sent and no reply has come since
	broken bool // the connection's state is unknown: drop it when given back

	// Guarded by TCPStore.mu.
	idle bool
	// pending is the wseq of the oldest reply-less write on the connection
	// not yet followed by a reply, once given back; 0 when none.
	pending uint64
	// interrupt, set while the holder waits (WAIT) with pending writes,
	// breaks that wait off so that the writes get confirmed.
	interrupt func()
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
	c := &TCPStore{addr: addr, opts: opts, conns: map[*tcpConn]struct{}{}, changed: make(chan struct{})}
	c.timeout.Store(int64(opts.Timeout))
	c.life, c.kill = context.WithCancel(context.Background())
	cn, err := c.connect(ctx)
	if err != nil {
		c.kill()
		return nil, err
	}
	c.conns[cn] = struct{}{}
	if opts.WorldSize > 0 && !opts.NoWaitForWorkers {
		// The announcement is made once per TCPStore, on its first
		// connection; connections dialled later do not repeat it.
		start := time.Now()
		k := initKey
		code, _ := encodeOp(opts.Dialect, opAdd)
		var n int64
		if err := c.roundTrip(ctx, cn, opAdd, []string{k}, start, code,
			func(b []byte) []byte { return appendI64(appendStr(b, k), 1) },
			func(r *reader) error { return readI64(r, &n) }); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	c.release(cn)
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

// call runs one request on a connection of the pool and reads its reply
// (none when read is nil), within the call's deadline.
func (c *TCPStore) call(ctx context.Context, o op, keys []string, build func([]byte) []byte, read func(*reader) error) error {
	start := time.Now()
	code, err := c.encode(o, keys, start)
	if err != nil {
		return err
	}
	return c.with(ctx, o, keys, start, false, func(cn *tcpConn) error {
		return c.roundTrip(ctx, cn, o, keys, start, code, build, read)
	})
}

// encode returns the code of o, or the error of a closed store or of a
// dialect without o.
func (c *TCPStore) encode(o op, keys []string, start time.Time) (byte, error) {
	if c.isClosed() {
		return 0, c.errorf(o, keys, start, "%w", ErrClosed)
	}
	code, ok := encodeOp(c.opts.Dialect, o)
	if !ok {
		return 0, c.errorf(o, keys, start, "%w: the %s dialect has no %s", ErrUnsupported, c.opts.Dialect, o)
	}
	return code, nil
}

func (c *TCPStore) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// with runs fn on a connection taken from the pool, then gives it back.
// blocking says that fn starts with a WAIT.
func (c *TCPStore) with(ctx context.Context, o op, keys []string, start time.Time, blocking bool, fn func(*tcpConn) error) error {
	cn, err := c.acquire(ctx, o, keys, start)
	if err != nil {
		return err
	}
	defer c.release(cn)
	if blocking && cn.dirty && c.opts.Dialect == DialectV1 {
		// The 1.x protocol cannot break a wait off (it has no
		// CANCEL_WAIT), so the connection's pending writes are confirmed
		// before it waits.
		if err := c.confirm(ctx, cn, o, keys, start); err != nil {
			return err
		}
	}
	return fn(cn)
}

// confirm runs a GETNUMKEYS round trip on cn: its reply confirms that the
// server has applied the requests sent before it.
func (c *TCPStore) confirm(ctx context.Context, cn *tcpConn, o op, keys []string, start time.Time) error {
	code, _ := encodeOp(c.opts.Dialect, opNumKeys)
	var n int64
	return c.roundTrip(ctx, cn, o, keys, start, code, func(b []byte) []byte { return b },
		func(r *reader) error { return readI64(r, &n) })
}

// roundTrip sends one request on cn and reads its reply (none when read is
// nil), all before the call's deadline. A failure marks cn broken: its
// state is unknown, and it is dropped when given back.
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
		if read == nil {
			cn.dirty = true
		} else {
			c.confirmed(cn)
		}
		return nil
	}
	if err == nil {
		err = ctx.Err()
	}
	cn.broken = true
	return c.wrapIOErr(ctx, o, keys, start, err)
}

// acquire takes a connection for a call that started at start: an idle one
// or, when none is idle, a new one. Before, it makes sure that the server
// has applied every reply-less write (SET and the like) given back before
// the call started, so that calls keep the order of one connection: such a
// write on the connection it takes is ordered by the connection itself;
// one on another idle connection is confirmed there with a round trip; one
// on a connection in use is waited for (that call reads a reply soon, or,
// if it waits, is made to cancel its wait, which confirms the writes).
func (c *TCPStore) acquire(ctx context.Context, o op, keys []string, start time.Time) (*tcpConn, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	c.mu.Lock()
	target := c.wseq
	for {
		if c.closed {
			c.mu.Unlock()
			return nil, c.errorf(o, keys, start, "%w", ErrClosed)
		}
		var unconfirmed []*tcpConn
		if c.ndirty > 0 {
			for cn := range c.conns {
				if cn.pending != 0 && cn.pending <= target {
					unconfirmed = append(unconfirmed, cn)
				}
			}
		}
		if len(unconfirmed) == 0 || len(unconfirmed) == 1 && unconfirmed[0].idle {
			var cn *tcpConn
			switch {
			case len(unconfirmed) == 1:
				cn = unconfirmed[0]
			case len(c.idle) > 0:
				cn = c.idle[len(c.idle)-1]
			}
			if cn == nil {
				c.mu.Unlock()
				return c.dial(ctx, o, keys, start)
			}
			c.takeLocked(cn)
			c.mu.Unlock()
			return cn, nil
		}
		var idle *tcpConn
		for _, cn := range unconfirmed {
			if cn.idle {
				idle = cn
				break
			}
			if cn.interrupt != nil {
				cn.interrupt()
			}
		}
		if idle != nil {
			c.takeLocked(idle)
			c.mu.Unlock()
			err := c.confirm(ctx, idle, o, keys, start)
			c.release(idle)
			// A connection that failed is dropped, and its writes with it,
			// as when the only connection fails; only the call's own end
			// stops it.
			if err != nil && (ctx.Err() != nil || errors.Is(err, ErrTimeout)) {
				return nil, err
			}
			c.mu.Lock()
			continue
		}
		ch := c.changed
		c.watchers++
		c.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(c.deadline(ctx, start)))
		}
		var err error
		select {
		case <-ch:
		case <-c.life.Done():
		case <-ctx.Done():
			err = c.wrapIOErr(ctx, o, keys, start, ctx.Err())
		case <-timer.C:
			if ctxDeadlineFirst(ctx, c.deadline(ctx, start)) {
				err = c.errorf(o, keys, start, "%w: %w", ErrTimeout, context.DeadlineExceeded)
			} else {
				err = c.errorf(o, keys, start, "%w after the store timeout %v, waiting for the writes of another connection to be confirmed", ErrTimeout, c.Timeout())
			}
		}
		c.mu.Lock()
		c.watchers--
		if err != nil {
			c.mu.Unlock()
			return nil, err
		}
	}
}

// dial connects a new connection for the pool; Close stops it.
func (c *TCPStore) dial(ctx context.Context, o op, keys []string, start time.Time) (*tcpConn, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.life, cancel)()
	cn, err := c.connect(dctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if cn != nil {
			_ = cn.nc.Close()
		}
		return nil, c.errorf(o, keys, start, "%w", ErrClosed)
	}
	if err != nil {
		return nil, err
	}
	c.conns[cn] = struct{}{}
	return cn, nil
}

// takeLocked takes cn, idle or not yet confirmed, for a call.
func (c *TCPStore) takeLocked(cn *tcpConn) {
	if cn.idle {
		cn.idle = false
		c.idle = slices.DeleteFunc(c.idle, func(x *tcpConn) bool { return x == cn })
	}
	cn.dirty = cn.pending != 0
	cn.broken = false
}

// release gives cn back: it becomes idle, or is closed when broken, when
// the store is closed, or when maxIdleConns confirmed connections are idle
// already.
func (c *TCPStore) release(cn *tcpConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cn.broken || c.closed {
		c.dropLocked(cn)
		return
	}
	if cn.dirty && cn.pending == 0 {
		c.wseq++
		cn.pending = c.wseq
		c.ndirty++
	}
	cn.idle = true
	c.idle = append(c.idle, cn)
	for len(c.idle) > maxIdleConns {
		// Close the least recently used of the confirmed ones; one with
		// unconfirmed writes stays until a call confirms them.
		i := slices.IndexFunc(c.idle, func(x *tcpConn) bool { return x.pending == 0 })
		if i < 0 {
			break
		}
		c.dropLocked(c.idle[i])
	}
	c.notifyLocked()
}

// dropLocked closes cn and forgets it.
func (c *TCPStore) dropLocked(cn *tcpConn) {
	_ = cn.nc.Close()
	if _, ok := c.conns[cn]; ok {
		delete(c.conns, cn)
		if cn.pending != 0 {
			c.ndirty--
		}
	}
	cn.pending = 0
	if cn.idle {
		cn.idle = false
		c.idle = slices.DeleteFunc(c.idle, func(x *tcpConn) bool { return x == cn })
	}
	c.notifyLocked()
}

// confirmed notes that a reply came on cn after its reply-less writes.
func (c *TCPStore) confirmed(cn *tcpConn) {
	if !cn.dirty {
		return
	}
	cn.dirty = false
	c.mu.Lock()
	if cn.pending != 0 {
		cn.pending = 0
		c.ndirty--
		c.notifyLocked()
	}
	c.mu.Unlock()
}

// notifyLocked wakes the calls of acquire that wait for a change.
func (c *TCPStore) notifyLocked() {
	if c.watchers > 0 {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// poolSize returns the number of open connections and of idle ones (for
// tests).
func (c *TCPStore) poolSize() (open, idle int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns), len(c.idle)
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

// waitOn sends WAIT for raw keys on cn and waits for STOP_WAITING until the
// call's deadline; on timeout it cancels the wait with CANCEL_WAIT
// (DialectV2), or drops the connection (DialectV1, which has no cancel).
// While writes sent before it on cn are unconfirmed, another call may
// break the wait off to have them confirmed: the wait is cancelled (whose
// reply confirms them) and sent again.
func (c *TCPStore) waitOn(ctx context.Context, cn *tcpConn, start time.Time, keys []string) error {
	code, _ := encodeOp(c.opts.Dialect, opWait)
	deadline := c.deadline(ctx, start)
	for {
		wctx, breakOff := ctx, context.CancelFunc(nil)
		if cn.dirty && c.opts.Dialect == DialectV2 {
			wctx, breakOff = context.WithCancel(ctx)
			c.mu.Lock()
			cn.interrupt = breakOff
			c.notifyLocked()
			c.mu.Unlock()
		}
		b := appendU64(append(cn.wbuf[:0], code), uint64(len(keys)))
		for _, k := range keys {
			b = appendStr(b, k)
		}
		cn.wbuf = b
		_ = cn.nc.SetDeadline(deadline)
		stop := interruptOnDone(wctx, cn.nc)
		_, err := cn.nc.Write(b)
		var r byte
		if err == nil {
			r, err = cn.br.ReadByte()
		}
		stop()
		brokenOff := false
		if breakOff != nil {
			c.mu.Lock()
			cn.interrupt = nil
			c.mu.Unlock()
			brokenOff = wctx.Err() != nil && ctx.Err() == nil
			breakOff()
		}
		if err == nil {
			// A reply, even one that came as ctx ended: honour it.
			if r != replyStopWait {
				cn.broken = true
				return c.errorf(opWait, keys, start, "%w: WAIT reply %d, want STOP_WAITING", errMalformed, r)
			}
			c.confirmed(cn)
			return nil
		}
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		if brokenOff && timedOut && time.Now().Before(deadline) {
			woken, cerr := c.cancelWait(cn)
			if cerr != nil {
				cn.broken = true
				return c.wrapIOErr(ctx, opWait, keys, start, cerr)
			}
			c.confirmed(cn)
			if woken {
				return nil
			}
			continue
		}
		if !timedOut && ctx.Err() == nil {
			cn.broken = true
			return c.wrapIOErr(ctx, opWait, keys, start, err)
		}
		elapsed := time.Since(start)
		if c.opts.Dialect == DialectV2 {
			if _, cerr := c.cancelWait(cn); cerr == nil {
				c.confirmed(cn)
			} else {
				cn.broken = true
			}
		} else {
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
}

// cancelWait sends CANCEL_WAIT on cn and reads its reply, after a possible
// STOP_WAITING that crossed it (woken).
func (c *TCPStore) cancelWait(cn *tcpConn) (woken bool, err error) {
	_ = cn.nc.SetDeadline(time.Now().Add(c.opts.CancelTimeout))
	code, _ := encodeOp(DialectV2, opCancelWait)
	if _, err := cn.nc.Write([]byte{code}); err != nil {
		return false, err
	}
	r, err := cn.br.ReadByte()
	if err != nil {
		return false, err
	}
	if r == replyStopWait {
		woken = true
		if r, err = cn.br.ReadByte(); err != nil {
			return woken, err
		}
	}
	if r != replyWaitCancel {
		return woken, fmt.Errorf("%w: CANCEL_WAIT reply %d", errMalformed, r)
	}
	return woken, nil
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
	start := time.Now()
	keys := []string{k}
	code, err := c.encode(opGet, keys, start)
	if err != nil {
		return nil, err
	}
	var v []byte
	err = c.with(ctx, opGet, keys, start, true, func(cn *tcpConn) error {
		if err := c.waitOn(ctx, cn, start, keys); err != nil {
			return err
		}
		return c.roundTrip(ctx, cn, opGet, keys, start, code, func(b []byte) []byte { return appendStr(b, k) },
			func(r *reader) error { return readValue(r, &v) })
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Add implements Store.
func (c *TCPStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	k := wireKey(key)
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

// Wait implements Store. On timeout it cancels the server-side wait, so
// the client stays usable.
func (c *TCPStore) Wait(ctx context.Context, keys ...string) error {
	start := time.Now()
	wk := wireKeys(keys)
	if _, err := c.encode(opWait, wk, start); err != nil {
		return err
	}
	return c.with(ctx, opWait, wk, start, true, func(cn *tcpConn) error {
		return c.waitOn(ctx, cn, start, wk)
	})
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
	start := time.Now()
	code, err := c.encode(opMultiGet, wk, start)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	err = c.with(ctx, opMultiGet, wk, start, true, func(cn *tcpConn) error {
		if err := c.waitOn(ctx, cn, start, wk); err != nil {
			return err
		}
		return c.roundTrip(ctx, cn, opMultiGet, wk, start, code, func(b []byte) []byte {
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
	keys := []string{k}
	start := time.Now()
	code, err := c.encode(opQueuePop, keys, start)
	if err != nil {
		return nil, err
	}
	var v []byte
	err = c.with(ctx, opQueuePop, keys, start, block, func(cn *tcpConn) error {
		for {
			if block {
				if err := c.waitOn(ctx, cn, start, keys); err != nil {
					return err
				}
			}
			var n int64
			err := c.roundTrip(ctx, cn, opQueuePop, keys, start, code, func(b []byte) []byte { return appendStr(b, k) },
				func(r *reader) error {
					if err := readI64(r, &n); err != nil || n <= 0 {
						return err
					}
					return readValue(r, &v)
				})
			if err != nil || n > 0 {
				return err
			}
			if !block {
				return c.errorf(opQueuePop, keys, start, "%w", ErrQueueEmpty)
			}
		}
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

// SetTimeout implements Store.
func (c *TCPStore) SetTimeout(d time.Duration) { c.timeout.Store(int64(d)) }

// Timeout implements Store.
func (c *TCPStore) Timeout() time.Duration { return time.Duration(c.timeout.Load()) }

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

// Close implements Store: it closes every connection, idle or in use, so
// that calls in flight fail at once with ErrClosed, and, for a master from
// NewTCPStore, the server.
func (c *TCPStore) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.kill()
		for cn := range c.conns {
			_ = cn.nc.Close()
		}
		clear(c.conns)
		c.idle, c.ndirty = nil, 0
		c.notifyLocked()
	}
	c.mu.Unlock()
	if c.server != nil {
		return c.server.Close()
	}
	return nil
}
