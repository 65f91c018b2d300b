package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/internal/uring"
)

// DefaultPort is PyTorch's default TCPStore port.
const DefaultPort = 29500

// ServerOptions configure a TCPServer. The zero value is usable.
type ServerOptions struct {
	// Addr is the address to bind, "host:port". Empty means ":29500" (every
	// interface, PyTorch's default port); port 0 picks a free port.
	Addr string
	// Listener, when set, is served instead of binding Addr (PyTorch's
	// master_listen_fd). The server closes it on Close.
	Listener net.Listener
	// MaxKeyLen bounds key lengths (default DefaultMaxKeyLen).
	MaxKeyLen int
	// MaxValueLen bounds value lengths (default DefaultMaxValueLen).
	MaxValueLen int
	// MaxKeysPerRequest bounds the key count of one request
	// (default DefaultMaxKeysPerRequest).
	MaxKeysPerRequest int
	// MaxRequestBytes bounds the key and value bytes of one multi-key
	// request, and of a MULTI_GET's reply (default DefaultMaxRequestBytes).
	MaxRequestBytes int
	// Secret, when non-empty, makes every client pass the HMAC handshake
	// (auth.go) before its first query. When nil, GOCOLL_STORE_SECRET is read.
	// PyTorch clients cannot pass it, so it is off by default.
	Secret []byte
	// NoEnvSecret stops the server from reading GOCOLL_STORE_SECRET.
	NoEnvSecret bool
	// HandshakeTimeout bounds the authentication handshake (default 10 s):
	// a connection that has not proved the secret by then is closed.
	HandshakeTimeout time.Duration
	// FrameTimeout bounds one request from its first byte to its last
	// (default 30 s), so that a request begun and never finished (a
	// slowloris) cannot hold a connection and its buffers. A connection
	// idle between requests is never timed out: PyTorch's clients sit idle
	// for hours.
	FrameTimeout time.Duration
	// MemoryBudget bounds, server-wide, the bytes of queued replies and
	// request buffers (default MemoryBudgetEnv, else DefaultMemoryBudget,
	// 256 MiB). A connection whose reply does not fit stops being read
	// until memory is released; each connection may always hold 64 KiB,
	// so small requests keep being answered. Stored data is not counted
	// (MaxValueLen and MaxRequestBytes bound what one request stores).
	MemoryBudget int64
	// MaxWaitKeysPerConn bounds the keys one connection waits on at once
	// (default DefaultMaxKeysPerRequest); a WAIT past it is answered
	// WAIT_CANCELED, which clients report as an error.
	MaxWaitKeysPerConn int
	// MaxConns bounds the open client connections (default: the soft
	// RLIMIT_NOFILE less a sixteenth, at least 64, for the server's own
	// files). Past it a new connection is closed at once, and the ones
	// open keep working.
	MaxConns int
	// WriteTimeout bounds one write to a client that does not read
	// (default 30 s); the connection is closed when it expires.
	WriteTimeout time.Duration
	// Logger receives one line per refused or malformed connection, at
	// most 10 a second (then a count of the lines left out). Nil means a
	// text logger on standard error.
	Logger *slog.Logger
	// Engine selects how connections are driven. The zero value,
	// EngineAuto, reads GOCOLL_STORE_ENGINE and otherwise uses io_uring
	// where the kernel has it.
	Engine Engine
	// Observer, when set, is told of every request the server handles
	// (package metrics counts them). Nil costs nothing per request.
	Observer ServerObserver
}

// ServerObserver sees a TCPServer's requests, for metrics. Request runs on
// the goroutine or the io_uring thread that handled the request, so it
// must be quick and safe for concurrent use.
type ServerObserver interface {
	// Request reports one request: its op ("SET", "GET", "WAIT", …) and
	// how long the server took to handle it (not the client's wait: a
	// WAIT's time is that of registering it).
	Request(op string, d time.Duration)
}

// ServerStats is a TCPServer's state at one moment (Stats).
type ServerStats struct {
	// Conns is the number of open client connections.
	Conns int
	// SendingBytes is the reply bytes being written to clients that have
	// not yet taken them (a client that does not read holds them here, up
	// to the write timeout).
	SendingBytes int64
}

// Engine is how a TCPServer drives its connections. Both engines speak the
// same protocol with the same limits; they differ in cost per request.
type Engine int

const (
	// EngineAuto is EngineRing where the kernel offers io_uring (Linux 6.1
	// or later, not disabled by kernel.io_uring_disabled), else
	// EngineGoroutines.
	EngineAuto Engine = iota
	// EngineGoroutines gives each connection a goroutine over Go's
	// network poller.
	EngineGoroutines
	// EngineRing serves TCP connections from one thread through io_uring:
	// one system call per batch of requests, no goroutine switch per
	// request. Requests run one at a time on that thread, as in PyTorch's
	// servers, so a very large one (a 64 MiB MULTI_SET) delays the others
	// while it is copied. Connections accepted from a non-TCP Listener
	// still get a goroutine. NewTCPServer fails where io_uring is not
	// available.
	EngineRing
)

// EngineEnv names the environment variable read when ServerOptions.Engine
// is EngineAuto: "auto", "ring" or "goroutines".
const EngineEnv = "GOCOLL_STORE_ENGINE"

// String returns "auto", "goroutines" or "ring".
func (e Engine) String() string {
	switch e {
	case EngineAuto:
		return "auto"
	case EngineGoroutines:
		return "goroutines"
	case EngineRing:
		return "ring"
	}
	return fmt.Sprintf("Engine(%d)", int(e))
}

// ParseEngine parses the names String returns.
func ParseEngine(s string) (Engine, error) {
	for _, e := range []Engine{EngineAuto, EngineGoroutines, EngineRing} {
		if s == e.String() {
			return e, nil
		}
	}
	return 0, fmt.Errorf("store: unknown engine %q (want auto, ring or goroutines)", s)
}

func (o *ServerOptions) fill() {
	if o.Addr == "" {
		o.Addr = ":" + strconv.Itoa(DefaultPort)
	}
	if o.MaxKeyLen <= 0 {
		o.MaxKeyLen = DefaultMaxKeyLen
	}
	if o.MaxValueLen <= 0 {
		o.MaxValueLen = DefaultMaxValueLen
	}
	if o.MaxKeysPerRequest <= 0 {
		o.MaxKeysPerRequest = DefaultMaxKeysPerRequest
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if len(o.Secret) == 0 && !o.NoEnvSecret {
		if s := os.Getenv(SecretEnv); s != "" {
			o.Secret = []byte(s)
		}
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.FrameTimeout <= 0 {
		o.FrameTimeout = 30 * time.Second
	}
	if o.MaxWaitKeysPerConn <= 0 {
		o.MaxWaitKeysPerConn = DefaultMaxKeysPerRequest
	}
	if o.MaxConns <= 0 {
		o.MaxConns = defaultMaxConns()
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}

// fillBudget applies MemoryBudgetEnv when MemoryBudget is 0.
func (o *ServerOptions) fillBudget() error {
	if o.MemoryBudget > 0 {
		return nil
	}
	o.MemoryBudget = DefaultMemoryBudget
	if v := os.Getenv(MemoryBudgetEnv); v != "" {
		n, err := ParseBytes(v)
		if err != nil {
			return fmt.Errorf("%s: %w", MemoryBudgetEnv, err)
		}
		o.MemoryBudget = n
	}
	return nil
}

// defaultMaxConns is the soft RLIMIT_NOFILE less a sixteenth (at least
// 64) of headroom for the listener, the ring and the process's other
// files; the engines hold one descriptor per connection.
func defaultMaxConns() int {
	n := nofileLimit()
	if n <= 0 {
		return 1 << 16
	}
	return max(n-max(n/16, 64), 16)
}

// TCPServer serves the TCPStore protocol to PyTorch and Go clients. One
// listener serves both dialects: a connection whose first bytes are VALIDATE
// with PyTorch's magic speaks DialectV2, any other DialectV1. Connections
// are driven by one of two engines (Engine): an io_uring event loop, or a
// goroutine each; with either, a slow or partial client delays no other,
// since a request runs only once all of it has arrived. The semantics are
// those of PyTorch's libuv server (the default since 2.4), except that a
// DialectV1 GET of a missing key closes the connection, as the 1.x server
// does.
type TCPServer struct {
	opts ServerOptions
	ln   net.Listener
	st   *serverState
	log  *slog.Logger
	ring *ringEngine // nil: every connection has its own goroutine

	sending atomic.Int64 // reply bytes handed to a write not yet complete (Stats)
	budget  *memBudget
	logs    logLimiter
	open    atomic.Int64 // connections accepted and not yet closed
	spare   spareFD      // a descriptor given up to accept and refuse on EMFILE
	fdMu    sync.Mutex   // held by refuseOne and by the ring's adopt, whose dup takes a descriptor for a moment

	connMu sync.Mutex
	conns  map[*srvConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewTCPServer binds opts.Addr (or takes opts.Listener) and starts serving.
// The listen backlog is the kernel's somaxconn (Go's default). Close stops
// it. ctx bounds only the bind.
func NewTCPServer(ctx context.Context, opts ServerOptions) (*TCPServer, error) {
	opts.fill()
	if err := opts.fillBudget(); err != nil {
		return nil, err
	}
	if opts.Engine == EngineAuto {
		if v := os.Getenv(EngineEnv); v != "" {
			e, err := ParseEngine(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", EngineEnv, err)
			}
			opts.Engine = e
		}
	}
	ln := opts.Listener
	if ln == nil {
		var lc net.ListenConfig
		var err error
		ln, err = lc.Listen(ctx, "tcp", opts.Addr)
		if err != nil {
			return nil, fmt.Errorf("store: tcp server failed to listen on %s: %w", opts.Addr, err)
		}
	}
	s := &TCPServer{opts: opts, ln: ln, st: newServerState(&opts), log: opts.Logger, conns: map[*srvConn]struct{}{}}
	s.budget = newMemBudget(opts.MemoryBudget)
	s.st.budget = s.budget
	s.logs.log = opts.Logger
	s.spare.open()
	if opts.Engine != EngineGoroutines {
		ring, err := startRing(s)
		switch {
		case err == nil:
			s.ring = ring
		case opts.Engine == EngineRing || !errors.Is(err, uring.ErrUnsupported):
			if opts.Listener == nil {
				_ = ln.Close()
			}
			return nil, fmt.Errorf("store: tcp server on %s: %w", opts.Addr, err)
		}
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Engine returns the engine the server runs: EngineRing or
// EngineGoroutines, never EngineAuto.
func (s *TCPServer) Engine() Engine {
	if s.ring != nil {
		return EngineRing
	}
	return EngineGoroutines
}

// Addr returns the address the server listens on.
func (s *TCPServer) Addr() net.Addr { return s.ln.Addr() }

// Port returns the TCP port the server listens on.
func (s *TCPServer) Port() int {
	if a, ok := s.ln.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Close stops accepting, closes every connection (so every blocked client
// fails at once with a closed-connection error) and waits for the
// connection goroutines to end. It is safe to call more than once.
func (s *TCPServer) Close() error {
	s.connMu.Lock()
	if s.closed {
		s.connMu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.connMu.Unlock()
	if s.ring != nil {
		s.ring.stop()
	}
	s.wg.Wait()
	s.spare.close()
	return err
}

// Stats returns the server's connection count and the reply bytes it is
// sending; metrics read it at each scrape.
func (s *TCPServer) Stats() ServerStats {
	return ServerStats{Conns: s.numConns(), SendingBytes: s.sending.Load()}
}

// isClosed reports whether Close has begun.
func (s *TCPServer) isClosed() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.closed
}

// numConns counts the open client connections.
func (s *TCPServer) numConns() int {
	s.connMu.Lock()
	n := len(s.conns)
	s.connMu.Unlock()
	if s.ring != nil {
		n += s.ring.numConns()
	}
	return n
}

func (s *TCPServer) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors: give the spare one up to accept the
			// connection that waits and close it, so that its client fails
			// at once rather than timing out in the backlog. When that
			// fails too, back off rather than spin.
			if (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)) && s.refuseOne() {
				delay = 0
				continue
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.logLimited("store server: accept failed", "addr", s.ln.Addr().String(), "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if n := s.open.Add(1); n > int64(s.opts.MaxConns) {
			s.open.Add(-1)
			s.logLimited("store server: refused connection: at the connection limit", "remote", nc.RemoteAddr().String(), "max_conns", s.opts.MaxConns)
			refuse(nc)
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		c := s.newConn(nc, nc)
		s.connMu.Lock()
		if s.closed {
			s.connMu.Unlock()
			s.open.Add(-1)
			_ = nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.connMu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.connMu.Lock()
			delete(s.conns, c)
			s.connMu.Unlock()
		}()
	}
}

// refuseOne accepts one waiting connection with the spare descriptor and
// closes it, reporting whether it did.
func (s *TCPServer) refuseOne() bool {
	tl, ok := s.ln.(*net.TCPListener)
	if !ok {
		return false
	}
	s.fdMu.Lock()
	defer s.fdMu.Unlock()
	// The spare may have been lost to another descriptor taken between
	// its close and its reopening: try again first, since a connection
	// may have closed since.
	s.spare.open()
	if !s.spare.release() {
		return false
	}
	// Never wait here, holding fdMu, for a connection that went away.
	_ = tl.SetDeadline(time.Now().Add(10 * time.Millisecond))
	nc, err := tl.Accept()
	_ = tl.SetDeadline(time.Time{})
	if err == nil {
		s.logLimited("store server: refused connection: out of file descriptors", "remote", nc.RemoteAddr().String())
		refuse(nc)
	}
	s.spare.open()
	return err == nil
}

// refuse closes a connection the server will not serve with a reset, so
// that its client fails at once and no TIME_WAIT is left.
func refuse(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}
