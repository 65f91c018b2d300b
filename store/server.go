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
	// HandshakeTimeout bounds the authentication handshake (default 10 s).
	HandshakeTimeout time.Duration
	// WriteTimeout bounds one write to a client that does not read
	// (default 30 s); the connection is closed when it expires.
	WriteTimeout time.Duration
	// Logger receives one line per refused or malformed connection. Nil
	// means a text logger on standard error.
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
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
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
	return err
}

// Stats returns the server's connection count and the reply bytes it is
// sending; metrics read it at each scrape.
func (s *TCPServer) Stats() ServerStats {
	return ServerStats{Conns: s.numConns(), SendingBytes: s.sending.Load()}
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
			s.connMu.Lock()
			closed := s.closed
			s.connMu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off and retry.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("store server: accept failed", "addr", s.ln.Addr().String(), "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		c := s.newConn(nc, nc)
		s.connMu.Lock()
		if s.closed {
			s.connMu.Unlock()
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
