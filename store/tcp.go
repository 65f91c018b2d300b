package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

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
	// (default 1 s), and so how long after its deadline the wait's error
	// may come; the connection is dropped when it expires. A server that
	// answers at all answers within a round trip. Where the server's host
	// never acknowledged the WAIT (Linux; the link or the host is down),
	// the connection is dropped at once, without the exchange.
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
		o.CancelTimeout = time.Second
	}
	return nil
}

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

// Clone implements Store: an independent TCPStore (its own connections) on
// the same server, with the same options and timeout, that does not
// announce itself under "init/".
func (c *TCPStore) Clone() (Store, error) {
	o := c.opts
	o.Timeout = c.Timeout()
	o.NoWaitForWorkers = true
	return DialTCPStore(context.Background(), c.addr, o)
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
