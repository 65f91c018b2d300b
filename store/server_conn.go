package store

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

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

	// session holds the replies queued for the client and its pending
	// waits; the server state works on it, never on the socket.
	session
	spare []byte // the buffer the last flush sent, reused for the next replies

	writeMu sync.Mutex
	ended   atomic.Bool // teardown ran

	// Scratch buffers of the connection's goroutine, reused by every
	// request: key bytes (kbuf, with the end offsets koff and views kviews
	// of a multi-key request) and a value (vbuf).
	kbuf   []byte
	koff   []int
	kviews [][]byte
	vbuf   []byte

	// reqCharged is what the request being read holds against the memory
	// budget (goroutine engine), given back once it has run.
	reqCharged int
	paused     bool // budgeted has logged this wait

	// Set when the ring engine drives the connection.
	ring  *ringEngine
	rconn *ringConn
}

func (s *TCPServer) newConn(nc net.Conn, w io.Writer) *srvConn {
	c := &srvConn{s: s, st: s.st, nc: nc, w: w, remote: "local"}
	c.conn = c
	c.budget = s.budget
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
			c.s.logLimited("store server: refused client", "remote", c.remote, "err", err)
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
	case errors.Is(err, errMalformed), errors.Is(err, errFrameTimeout):
		c.s.logLimited("store server: closing connection", "remote", c.remote, "dialect", c.dialect.String(), "err", err)
	default:
		c.s.logs.emit(c.s.log, slog.LevelInfo, "store server: connection ended", "remote", c.remote, "err", err)
	}
}

// teardown drops the connection's pending waits, gives its memory back to
// the budget and closes it.
func (c *srvConn) teardown() {
	if c.ended.Swap(true) {
		return
	}
	if c.nc != nil {
		c.s.open.Add(-1)
	}
	c.st.drop(&c.session)
	c.releaseAll()
	c.releaseRequest()
	if c.nc != nil {
		_ = c.nc.Close()
	}
}

// errFrameTimeout reports a request that started and did not complete
// within FrameTimeout (a client that stalls, or a slowloris).
var errFrameTimeout = errors.New("request not completed in time")

// budgeted runs f, a request's step on the state that may queue a large
// reply; while the memory budget cannot take the reply, the goroutine
// engine sends its own replies and waits for memory (the connection reads
// nothing meanwhile) and runs f again. The ring engine gets errOverBudget
// back and runs the whole request again later (ring_linux.go).
func (c *srvConn) budgeted(f func() error) error {
	var start time.Time // only once it waits: a clock read costs more than the request
	for {
		err := f()
		if err == nil || c.ring != nil || !errors.Is(err, errOverBudget) {
			c.paused = false
			return err
		}
		if start.IsZero() {
			start = time.Now()
		}
		if err := c.flush(); err != nil {
			return err
		}
		if !c.paused {
			c.paused = true
			c.logPaused()
		}
		if time.Since(start) > c.s.opts.WriteTimeout {
			return fmt.Errorf("%w: a reply waited %v for the server's memory budget (%d bytes, all held by replies clients do not read)", errMalformed,
				c.s.opts.WriteTimeout, c.budget.limit)
		}
		ch, done := c.s.budget.released()
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
		done()
		if c.s.isClosed() {
			return net.ErrClosed
		}
	}
}

// logPaused says, rate-limited, that the connection waits for the memory
// budget.
func (c *srvConn) logPaused() {
	c.s.logLimited("store server: memory budget spent; connection paused until memory is released", "remote", c.remote,
		"budget", c.s.budget.limit, "used", c.s.budget.Used())
}

// chargeRequest is the reader's grow hook of the goroutine engine: it
// counts a request buffer's next chunk against the budget, and refuses it,
// which closes the connection, when the budget cannot take it.
func (c *srvConn) chargeRequest(n int) error {
	if !c.s.budget.admit(c.reqCharged, n) {
		return fmt.Errorf("%w: a request over %d bytes while the server's memory budget (%d bytes) is spent", errMalformed, c.reqCharged+n, c.s.budget.limit)
	}
	c.reqCharged += n
	c.s.budget.charge(n)
	return nil
}

// releaseRequest gives back what the last request's buffers held.
func (c *srvConn) releaseRequest() {
	if c.reqCharged > 0 {
		c.s.budget.release(c.reqCharged)
		c.reqCharged = 0
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
		c.frameDeadline(5)
		hdr, err := c.br.Peek(5)
		if err != nil {
			return c.frameErr(err)
		}
		if uint32(hdr[1])|uint32(hdr[2])<<8|uint32(hdr[3])<<16|uint32(hdr[4])<<24 == validationMagic {
			c.dialect = DialectV2
			_, _ = c.br.Discard(5)
		}
	}
	if c.nc != nil {
		c.rd.grow = c.chargeRequest
	}
	for {
		// Idle between requests is fine (torch clients idle for hours);
		// a request that has begun must end within FrameTimeout.
		if _, err := c.br.Peek(1); err != nil {
			return err
		}
		timed := c.frameDeadline(0)
		err := c.handleOne()
		c.releaseRequest()
		if timed {
			_ = c.nc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			// The replies to the requests before the bad one still go.
			_ = c.flush()
			return c.frameErr(err)
		}
		c.trimScratch()
		// Replies are batched: the ones of pipelined requests leave in one
		// write, once the requests already received are all handled, or
		// once the connection holds more than its share (overShare), so
		// that small requests for large values cannot make the server
		// hold unbounded replies for a client that does not read.
		if c.br.Buffered() == 0 || c.overShare() {
			if err := c.flush(); err != nil {
				return err
			}
		}
	}
}

// frameDeadline sets the read deadline of a request that has begun and is
// not all buffered yet (want > 0: at least want bytes; 0: frameLen's
// answer), and reports whether it did.
func (c *srvConn) frameDeadline(want int) bool {
	if c.nc == nil {
		return false
	}
	n := c.br.Buffered()
	if want == 0 {
		b, _ := c.br.Peek(n)
		if l, _ := frameLen(c.dialect, &c.s.opts, b); l > 0 {
			return false
		}
	} else if n >= want {
		return false
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(c.s.opts.FrameTimeout))
	return true
}

// frameErr names a read deadline's expiry as errFrameTimeout.
func (c *srvConn) frameErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: a request began and was not complete after %v", errFrameTimeout, c.s.opts.FrameTimeout)
	}
	return err
}

// maxQueuedReplies bounds the reply bytes a connection queues before it
// stops handling requests until they are sent.
const maxQueuedReplies = 1 << 20

// flush writes the queued responses. Writers are serialised so the
// responses leave in the order they were queued.
func (c *srvConn) flush() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.outMu.Lock()
	buf := c.out
	c.out = c.spare[:0]
	c.sending = len(buf)
	c.settleLocked()
	c.outMu.Unlock()
	if len(buf) == 0 {
		c.spare = buf
		return nil
	}
	if c.nc != nil {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	}
	c.s.sending.Add(int64(len(buf)))
	_, err := c.w.Write(buf)
	c.s.sending.Add(-int64(len(buf)))
	c.outMu.Lock()
	c.sending = 0
	c.sentLocked(len(buf))
	c.outMu.Unlock()
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

func isConnReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func isMalformed(err error) bool { return errors.Is(err, errMalformed) }
