package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
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

	connMu sync.Mutex
	conns  map[*srvConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// serverState is the data of a server, shared by its connections.
type serverState struct {
	mu      sync.Mutex
	kv      map[string][]byte
	queues  map[string][][]byte
	waiters map[string][]*waitReq
}

// waitReq is one pending WAIT of one connection.
type waitReq struct {
	c         *srvConn
	keys      []string
	remaining int
	done      bool
}

func newServerState() *serverState {
	return &serverState{kv: map[string][]byte{}, queues: map[string][][]byte{}, waiters: map[string][]*waitReq{}}
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
	s := &TCPServer{opts: opts, ln: ln, st: newServerState(), log: opts.Logger, conns: map[*srvConn]struct{}{}}
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

// srvConn is one client connection.
type srvConn struct {
	s       *TCPServer
	st      *serverState
	nc      net.Conn // nil in parser-only tests
	w       io.Writer
	br      *bufio.Reader
	rd      reader
	remote  string
	dialect Dialect

	outMu sync.Mutex
	out   []byte
	spare []byte

	writeMu sync.Mutex

	// Scratch buffers of the connection's goroutine, reused by every
	// request: key bytes (kbuf, with the end offsets koff and views kviews
	// of a multi-key request), a value (vbuf) and a decimal (num).
	kbuf   []byte
	koff   []int
	kviews [][]byte
	vbuf   []byte
	num    [24]byte

	// guarded by st.mu
	waits []*waitReq
	dead  bool

	// Set when the ring engine drives the connection.
	ring  *ringEngine
	rconn *ringConn
}

func (s *TCPServer) newConn(nc net.Conn, w io.Writer) *srvConn {
	c := &srvConn{s: s, st: s.st, nc: nc, w: w, remote: "local"}
	if nc != nil {
		c.remote = nc.RemoteAddr().String()
		var src io.Reader = nc
		if rd, wr := newRawIO(nc); rd != nil && w == nc {
			src, c.w = rd, wr
		}
		c.br = bufio.NewReaderSize(src, 16<<10)
	}
	c.rd.r = c.br
	return c
}

// serve runs the connection until EOF, a malformed request or Close, or
// until the ring engine adopts it after the handshake.
func (c *srvConn) serve() {
	if len(c.s.opts.Secret) > 0 {
		if err := c.authenticate(); err != nil {
			c.s.log.Warn("store server: refused client", "remote", c.remote, "err", err)
			c.teardown()
			return
		}
	}
	if c.s.ring != nil && c.s.ring.adopt(c) {
		return
	}
	defer c.teardown()
	c.logEnd(c.serveStream())
}

// logEnd logs why a connection ended, unless the client just left.
func (c *srvConn) logEnd(err error) {
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), isConnReset(err):
	case errors.Is(err, errFrameMismatch):
		c.s.log.Error("store server: closing connection", "remote", c.remote, "dialect", c.dialect.String(), "err", err)
	case errors.Is(err, errMalformed):
		c.s.log.Warn("store server: closing connection", "remote", c.remote, "dialect", c.dialect.String(), "err", err)
	default:
		c.s.log.Info("store server: connection ended", "remote", c.remote, "err", err)
	}
}

// teardown drops the connection's pending waits and closes it.
func (c *srvConn) teardown() {
	c.st.mu.Lock()
	c.dead = true
	c.st.dropWaitsLocked(c)
	c.st.mu.Unlock()
	if c.nc != nil {
		_ = c.nc.Close()
	}
}

// serveStream detects the dialect and handles requests until an error.
func (c *srvConn) serveStream() error {
	first, err := c.br.Peek(1)
	if err != nil {
		return err
	}
	c.dialect = DialectV1
	if first[0] == 0 {
		// VALIDATE+magic means DialectV2. A 1.x SET would need a key of
		// about 1 GiB for its length to match the magic.
		if hdr, err := c.br.Peek(5); err == nil && uint32(hdr[1])|uint32(hdr[2])<<8|uint32(hdr[3])<<16|uint32(hdr[4])<<24 == validationMagic {
			c.dialect = DialectV2
			_, _ = c.br.Discard(5)
		} else if err != nil {
			return err
		}
	}
	for {
		if err := c.handleOne(); err != nil {
			// The replies to the requests before the bad one still go.
			_ = c.flush()
			return err
		}
		c.trimScratch()
		// Replies are batched: the ones of pipelined requests leave in one
		// write, once the requests already received are all handled, or
		// once they pass maxQueuedReplies, so that small requests for
		// large values cannot make the server hold unbounded replies for a
		// client that does not read.
		if c.br.Buffered() == 0 || c.queued() > maxQueuedReplies {
			if err := c.flush(); err != nil {
				return err
			}
		}
	}
}

// maxQueuedReplies bounds the reply bytes a connection queues before it
// stops handling requests until they are sent.
const maxQueuedReplies = 1 << 20

// queued returns the length of the replies waiting to be sent.
func (c *srvConn) queued() int {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	return len(c.out)
}

// reply queues response bytes.
func (c *srvConn) reply(b ...byte) {
	c.outMu.Lock()
	c.out = append(c.out, b...)
	c.outMu.Unlock()
}

// replyFn lets the caller append to the output buffer directly.
func (c *srvConn) replyFn(f func([]byte) []byte) {
	c.outMu.Lock()
	c.out = f(c.out)
	c.outMu.Unlock()
}

// flush writes the queued responses. Writers are serialised so the
// responses leave in the order they were queued.
func (c *srvConn) flush() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.outMu.Lock()
	buf := c.out
	c.out = c.spare[:0]
	c.outMu.Unlock()
	if len(buf) == 0 {
		c.spare = buf
		return nil
	}
	if c.nc != nil {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	}
	_, err := c.w.Write(buf)
	if cap(buf) <= 64<<10 {
		c.spare = buf[:0]
	} else {
		c.spare = nil
	}
	if err != nil {
		return fmt.Errorf("write response: %w", err)
	}
	return nil
}

// wakeFlush flushes a connection from another goroutine, after a write of
// this one completed its WAIT.
func (c *srvConn) wakeFlush() {
	if c.ring != nil {
		c.ring.kick(c)
		return
	}
	go func() {
		if err := c.flush(); err != nil && c.nc != nil {
			_ = c.nc.Close()
		}
	}()
}

// trimScratch drops scratch buffers that a large request grew, so that an
// idle connection keeps only small ones.
func (c *srvConn) trimScratch() {
	const keep = 64 << 10
	if cap(c.kbuf) > keep {
		c.kbuf = nil
	}
	if cap(c.vbuf) > keep {
		c.vbuf = nil
	}
	if cap(c.koff) > keep/8 {
		c.koff, c.kviews = nil, nil
	}
}

// keyB reads a key into the connection's scratch buffer; the bytes are valid
// until the next request.
func (c *srvConn) keyB() ([]byte, error) {
	b, err := c.rd.appendBytes(c.kbuf[:0], "key", c.s.opts.MaxKeyLen)
	if err == nil {
		c.kbuf = b
	}
	return b, err
}

// valueB reads a value into the connection's scratch buffer; the bytes are
// valid until the next request, so a stored value must be copied.
func (c *srvConn) valueB() ([]byte, error) {
	b, err := c.rd.appendBytes(c.vbuf[:0], "value", c.s.opts.MaxValueLen)
	if err == nil {
		c.vbuf = b
	}
	return b, err
}

// keysB reads the keys of a multi-key request into scratch; the views are
// valid until the next request.
func (c *srvConn) keysB() ([][]byte, error) {
	n, err := c.rd.count("key", c.s.opts.MaxKeysPerRequest)
	if err != nil {
		return nil, err
	}
	buf, offs := c.kbuf[:0], c.koff[:0]
	total := 0
	for range n {
		start := len(buf)
		if buf, err = c.rd.appendBytes(buf, "key", c.s.opts.MaxKeyLen); err != nil {
			return nil, err
		}
		if total += len(buf) - start + 8; total > c.s.opts.MaxRequestBytes {
			return nil, fmt.Errorf("%w: request of %d keys exceeds %d bytes", errMalformed, n, c.s.opts.MaxRequestBytes)
		}
		offs = append(offs, len(buf))
	}
	views, prev := c.kviews[:0], 0
	for _, o := range offs {
		views = append(views, buf[prev:o:o])
		prev = o
	}
	c.kbuf, c.koff, c.kviews = buf, offs, views
	return views, nil
}

func (c *srvConn) key() (string, error) {
	b, err := c.rd.bytes("key", c.s.opts.MaxKeyLen)
	return string(b), err
}

func (c *srvConn) value() ([]byte, error) { return c.rd.bytes("value", c.s.opts.MaxValueLen) }

// keyValue reads a key, then a value.
func (c *srvConn) keyValue() (string, []byte, error) {
	k, err := c.key()
	if err != nil {
		return "", nil, err
	}
	v, err := c.value()
	return k, v, err
}

// handleOne reads and executes one request.
func (c *srvConn) handleOne() error {
	code, err := c.rd.u8()
	if err != nil {
		return err
	}
	o := decodeOp(c.dialect, code)
	st := c.st
	switch o {
	case opSet:
		k, err := c.keyB()
		if err != nil {
			return err
		}
		v, err := c.valueB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.setLocked(k, v)
		wake := st.wakeLockedB(k, nil)
		st.mu.Unlock()
		flushAll(wake)

	case opCompareSet:
		k, exp, err := c.keyValue()
		if err != nil {
			return err
		}
		des, err := c.value()
		if err != nil {
			return err
		}
		var wake []*srvConn
		var res []byte
		st.mu.Lock()
		cur, ok := st.kv[k]
		switch {
		case !ok && len(exp) == 0, ok && bytes.Equal(cur, exp):
			st.kv[k] = des
			res = des
			wake = st.wakeLocked(k, nil)
		case !ok:
			res = exp // PyTorch's documented quirk
		default:
			res = cur
		}
		c.replyFn(func(b []byte) []byte { return appendStr(b, res) })
		st.mu.Unlock()
		flushAll(wake)

	case opGet:
		k, err := c.keyB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		// Values may be overwritten in place (setLocked), so the reply is
		// copied out under the lock.
		v, ok := st.kv[string(k)]
		if ok || c.dialect != DialectV1 {
			c.outMu.Lock()
			c.out = appendStr(c.out, v)
			c.outMu.Unlock()
		}
		st.mu.Unlock()
		if !ok && c.dialect == DialectV1 {
			return fmt.Errorf("%w: GET of missing key %q (the 1.x server closes the connection)", errMalformed, k)
		}

	case opAdd:
		k, err := c.keyB()
		if err != nil {
			return err
		}
		d, err := c.rd.u64()
		if err != nil {
			return err
		}
		st.mu.Lock()
		var cur int64
		if v, ok := st.kv[string(k)]; ok {
			if cur, err = parseStoll(v); err != nil {
				st.mu.Unlock()
				return fmt.Errorf("%w: ADD to key %q: %w", errMalformed, k, err)
			}
		}
		cur += int64(d) //nolint:gosec // wraps like the C++ server
		st.setLocked(k, strconv.AppendInt(c.num[:0], cur, 10))
		wake := st.wakeLockedB(k, nil)
		c.replyFn(func(b []byte) []byte { return appendI64(b, cur) })
		st.mu.Unlock()
		flushAll(wake)

	case opCheck:
		keys, err := c.keysB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		r := replyReady
		for _, k := range keys {
			if !st.hasLocked(k) {
				r = replyNotReady
				break
			}
		}
		st.mu.Unlock()
		c.reply(r)

	case opWait:
		keys, err := c.keysB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		var wr *waitReq // only a wait that blocks allocates
		for _, kb := range keys {
			if !st.hasLocked(kb) {
				if wr == nil {
					wr = &waitReq{c: c}
				}
				k := string(kb)
				wr.remaining++
				wr.keys = append(wr.keys, k)
				st.waiters[k] = append(st.waiters[k], wr)
			}
		}
		if wr == nil {
			c.reply(replyStopWait)
		} else {
			c.waits = append(c.waits, wr)
		}
		st.mu.Unlock()

	case opNumKeys:
		st.mu.Lock()
		n := len(st.kv)
		st.mu.Unlock()
		c.replyFn(func(b []byte) []byte { return appendI64(b, int64(n)) })

	case opDeleteKey:
		k, err := c.keyB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		_, ok := st.kv[string(k)]
		if ok {
			delete(st.kv, string(k))
		}
		st.mu.Unlock()
		var r int64
		if ok {
			r = 1
		}
		c.replyFn(func(b []byte) []byte { return appendI64(b, r) })

	case opAppend:
		k, v, err := c.keyValue()
		if err != nil {
			return err
		}
		st.mu.Lock()
		old := st.kv[k]
		if len(old)+len(v) > c.s.opts.MaxValueLen {
			st.mu.Unlock()
			return fmt.Errorf("%w: APPEND to key %q would make a value of %d bytes, over the limit %d", errMalformed, k, len(old)+len(v), c.s.opts.MaxValueLen)
		}
		nv := make([]byte, 0, len(old)+len(v))
		st.kv[k] = append(append(nv, old...), v...)
		wake := st.wakeLocked(k, nil)
		st.mu.Unlock()
		flushAll(wake)

	case opMultiGet:
		keys, err := c.keysB()
		if err != nil {
			return err
		}
		st.mu.Lock()
		// One small request must not make an unbounded reply (the same
		// key many times over a large value).
		size := 0
		for _, k := range keys {
			size += 8 + len(st.kv[string(k)])
		}
		if size > c.s.opts.MaxRequestBytes {
			st.mu.Unlock()
			return fmt.Errorf("%w: MULTI_GET of %d keys would reply %d bytes, over the limit %d", errMalformed, len(keys), size, c.s.opts.MaxRequestBytes)
		}
		c.outMu.Lock()
		for _, k := range keys {
			c.out = appendStr(c.out, st.kv[string(k)])
		}
		c.outMu.Unlock()
		st.mu.Unlock()

	case opMultiSet:
		n, err := c.rd.count("key", c.s.opts.MaxKeysPerRequest)
		if err != nil {
			return err
		}
		keys := make([]string, 0, min(n, 1024))
		vals := make([][]byte, 0, min(n, 1024))
		total := 0
		for range n {
			k, v, err := c.keyValue()
			if err != nil {
				return err
			}
			if total += len(k) + len(v) + 16; total > c.s.opts.MaxRequestBytes {
				return fmt.Errorf("%w: MULTI_SET of %d keys exceeds %d bytes", errMalformed, n, c.s.opts.MaxRequestBytes)
			}
			keys, vals = append(keys, k), append(vals, v)
		}
		var wake []*srvConn
		st.mu.Lock()
		for i, k := range keys {
			st.kv[k] = vals[i]
			wake = st.wakeLocked(k, wake)
		}
		st.mu.Unlock()
		flushAll(wake)

	case opCancelWait:
		st.mu.Lock()
		st.dropWaitsLocked(c)
		c.reply(replyWaitCancel)
		st.mu.Unlock()

	case opPing:
		n, err := c.rd.u32()
		if err != nil {
			return err
		}
		c.replyFn(func(b []byte) []byte { return appendU32(b, n) })

	case opQueuePush:
		k, v, err := c.keyValue()
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.queues[k] = append(st.queues[k], v)
		wake := st.wakeOneLocked(k)
		st.mu.Unlock()
		flushAll(wake)

	case opQueuePop:
		k, err := c.key()
		if err != nil {
			return err
		}
		st.mu.Lock()
		q := st.queues[k]
		n := len(q)
		var v []byte
		if n > 0 {
			v = q[0]
			q[0] = nil
			if n == 1 {
				delete(st.queues, k)
			} else {
				st.queues[k] = q[1:]
			}
		}
		c.replyFn(func(b []byte) []byte {
			b = appendI64(b, int64(n))
			if n > 0 {
				b = appendStr(b, v)
			}
			return b
		})
		st.mu.Unlock()

	case opQueueLen:
		k, err := c.key()
		if err != nil {
			return err
		}
		st.mu.Lock()
		n := len(st.queues[k])
		st.mu.Unlock()
		c.replyFn(func(b []byte) []byte { return appendI64(b, int64(n)) })

	case opListKeys:
		st.mu.Lock()
		c.replyFn(func(b []byte) []byte {
			b = appendI64(b, int64(len(st.kv)))
			for k := range st.kv {
				b = appendStr(b, k)
			}
			return b
		})
		st.mu.Unlock()

	case opValidate:
		return fmt.Errorf("%w: VALIDATE after the start of the connection", errMalformed)
	case opWatchKey:
		return fmt.Errorf("%w: WATCH_KEY (1.x watchKey) is not supported", errMalformed)
	default:
		return fmt.Errorf("%w: unknown query code %d (0x%02x) for dialect %s", errMalformed, code, code, c.dialect)
	}
	return nil
}

// hasLocked reports whether key exists as a value or a non-empty queue.
func (st *serverState) hasLocked(k []byte) bool {
	if _, ok := st.kv[string(k)]; ok {
		return true
	}
	return len(st.queues[string(k)]) > 0
}

// setLocked stores a copy of v under k. An existing value of the same
// length is overwritten in place, so that a repeated set allocates neither
// a key nor a value; every reader of st.kv therefore copies values out
// before it unlocks.
func (st *serverState) setLocked(k, v []byte) {
	if old, ok := st.kv[string(k)]; ok && len(old) == len(v) {
		copy(old, v)
		return
	}
	st.kv[string(k)] = bytes.Clone(v)
}

// wakeLocked counts key k as arrived for every wait on it; connections whose
// wait is complete get STOP_WAITING queued and are appended to wake, which
// the caller flushes after unlocking.
// Only the waits on k are visited: waiters of other keys are not disturbed.
func (st *serverState) wakeLocked(k string, wake []*srvConn) []*srvConn {
	list, ok := st.waiters[k]
	if !ok {
		return wake
	}
	delete(st.waiters, k)
	return st.wakeListLocked(list, wake)
}

// wakeLockedB is wakeLocked for a key in a scratch buffer; it allocates
// nothing when k has no waiters.
func (st *serverState) wakeLockedB(k []byte, wake []*srvConn) []*srvConn {
	list, ok := st.waiters[string(k)]
	if !ok {
		return wake
	}
	delete(st.waiters, string(k))
	return st.wakeListLocked(list, wake)
}

func (st *serverState) wakeListLocked(list []*waitReq, wake []*srvConn) []*srvConn {
	for _, wr := range list {
		if wr.done {
			continue
		}
		if wr.remaining--; wr.remaining == 0 {
			wake = st.completeLocked(wr, wake)
		}
	}
	return wake
}

// wakeOneLocked counts a queue push on k for the oldest wait on it only, so
// that one blocked queue_pop is woken per pushed item.
func (st *serverState) wakeOneLocked(k string) []*srvConn {
	list := st.waiters[k]
	for i, wr := range list {
		if wr.done {
			continue
		}
		rest := append(list[:i:i], list[i+1:]...)
		if len(rest) == 0 {
			delete(st.waiters, k)
		} else {
			st.waiters[k] = rest
		}
		if wr.remaining--; wr.remaining == 0 {
			return st.completeLocked(wr, nil)
		}
		return nil
	}
	delete(st.waiters, k)
	return nil
}

func (st *serverState) completeLocked(wr *waitReq, wake []*srvConn) []*srvConn {
	wr.done = true
	c := wr.c
	for i, x := range c.waits {
		if x == wr {
			c.waits = append(c.waits[:i], c.waits[i+1:]...)
			break
		}
	}
	if c.dead {
		return wake
	}
	c.reply(replyStopWait)
	return append(wake, c)
}

// dropWaitsLocked cancels every pending wait of c.
func (st *serverState) dropWaitsLocked(c *srvConn) {
	for _, wr := range c.waits {
		wr.done = true
		for _, k := range wr.keys {
			list := st.waiters[k]
			out := list[:0]
			for _, x := range list {
				if !x.done {
					out = append(out, x)
				}
			}
			clear(list[len(out):])
			if len(out) == 0 {
				delete(st.waiters, k)
			} else {
				st.waiters[k] = out
			}
		}
	}
	c.waits = nil
}

func flushAll(cs []*srvConn) {
	for _, c := range cs {
		c.wakeFlush()
	}
}

func isConnReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func isMalformed(err error) bool { return errors.Is(err, errMalformed) }
