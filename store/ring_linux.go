package store

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/internal/uring"
)

// ringEngine serves TCP connections from one OS thread through io_uring.
//
// Why: on a loaded server the per-request cost is dominated by system calls
// (a read, a write, and with Go's poller a read that finds nothing before
// the goroutine parks) and by the scheduler. Here one io_uring_enter hands
// the kernel every send and receive of a batch of connections and collects
// their results, and requests are parsed and executed on the engine's
// thread with no goroutine switch. The parser is the same: frameLen waits
// for a whole request, then handleOne runs over bytes already in memory.
//
// Connections are accepted, and authenticated when a secret is set, by the
// ordinary per-connection goroutine, which then hands the socket over
// (adopt). Other goroutines reach the engine only through its mailbox
// (post), woken by an eventfd when the engine sleeps in the kernel.
type ringEngine struct {
	s     *TCPServer
	u     *uring.Ring
	efd   int
	ebuf  [8]byte
	tick  uring.Timespec
	conns map[uint64]*ringConn
	ids   uint64
	dirty []*ringConn // connections whose woken WAITs queued replies
	quit  bool
	// budgetWait holds the connections paused for the memory budget (a
	// reply or a request buffer that did not fit); they run again after
	// memory is released (retryBudget set) and at every tick.
	budgetWait  []*ringConn
	retryBudget bool
	// offloads counts the large requests running on goroutines (offload);
	// shutdown waits for them before it tears their connections down.
	offloads sync.WaitGroup

	mu       sync.Mutex // guards the mailbox below
	incoming []*ringConn
	kicked   []*srvConn
	finished []*ringConn  // offloaded requests that have run
	stopping bool         // Close asked the engine to stop
	stopped  bool         // the engine takes no more mail
	live     atomic.Int64 // connections adopted and not yet closed
	mail     atomic.Bool  // the mailbox is not empty
	sleeping atomic.Bool  // the engine is, or is about to be, waiting in the kernel
	done     chan struct{}
}

// ringConn is one connection owned by the engine.
type ringConn struct {
	id     uint64
	fd     int
	c      *srvConn
	src    sliceSource // the parser's view of complete requests
	in     []byte      // received and not yet handled
	need   int         // len(in) needed before frameLen can say more
	out    []byte      // the send in flight
	spare  []byte
	sentAt time.Time

	detected, recving, closing, isDirty bool
	held                                bool // requests wait for replies to drain
	budgetWaiting                       bool // in the engine's budgetWait
	// inCharged is the part of in's capacity over ringMinRecv that the
	// memory budget holds.
	inCharged int
	// partialSince is when the request at the head of in began to
	// arrive, zero when in holds no partial request: FrameTimeout runs
	// from it.
	partialSince time.Time
	// ending: no more requests are read; the connection closes with
	// endErr once the replies already queued are sent.
	ending bool
	endErr error
	// busy: the request at the head of in (busyN bytes) runs on a
	// goroutine (offload); until it is back, the engine neither handles,
	// reads nor tears down the connection, and the goroutine owns the
	// parser (src, the srvConn's reader and scratch). busyErr is its result.
	busy    bool
	busyN   int
	busyErr error
}

// Completion tags, in the low bits of user data; the rest is the
// connection's id (0 for the engine's own entries).
const (
	tagRecv = iota
	tagSend
	tagEvent
	tagTick
	tagBits = 2
)

const (
	ringEntries = 4096
	ringMinRecv = 4 << 10  // free space for a receive
	ringMaxGrow = 64 << 10 // the input grows at most this far ahead of the data

	// ringSpin is how many times the engine polls the ring (a
	// non-blocking io_uring_enter each) before it sleeps. A client's next
	// request often arrives within microseconds of the reply, and sleeping
	// and being woken costs more than that (an IPI in a VM; and Go's
	// monitor thread takes the processor back from a thread blocked in a
	// system call). Measured here (0, 5 and 15 polls, one interleaved
	// run): 15 lifted one connection's closed loop from 0.9× to 1.9×
	// torch's rate and changed nothing at 64 and 256 connections, for ~10
	// more points of CPU at 5 k ops/s; 16 is what the later runs used.
	ringSpin = 16

	// ringOffloadBytes is the request size from which the engine runs a
	// request on a goroutine instead of its own thread (offload). A
	// MULTI_SET of 128 Ki keys (2.4 MB) took 140-280 ms to parse and
	// apply here, and every other connection waited that long; a request
	// of 32 KiB holds at most ~1.8 Ki keys, a few milliseconds, while the
	// goroutine and the mailbox round trip cost ~10 µs, which small
	// requests, the ones the engine exists for, never pay.
	ringOffloadBytes = 32 << 10
)

// startRing starts the engine's thread, or returns uring.ErrUnsupported.
func startRing(s *TCPServer) (*ringEngine, error) {
	e := &ringEngine{s: s, conns: map[uint64]*ringConn{}, done: make(chan struct{}), tick: uring.Timespec{Sec: 1}}
	started := make(chan error, 1)
	go func() {
		// The thread stays locked until the goroutine ends, so it exits
		// with it: the ring belongs to this thread (SINGLE_ISSUER).
		runtime.LockOSThread()
		u, err := uring.New(ringEntries)
		if err != nil {
			started <- err
			return
		}
		fd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if errno != 0 {
			u.Close()
			started <- fmt.Errorf("store: eventfd: %w", errno)
			return
		}
		e.u, e.efd = u, int(fd)
		started <- nil
		e.run()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return e, nil
}

// post runs f on the mailbox and wakes the engine if it sleeps. It reports
// false, without running f, once the engine has stopped.
func (e *ringEngine) post(f func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return false
	}
	f()
	e.mail.Store(true)
	// The engine sets sleeping before it looks at mail, and this stores
	// mail before it looks at sleeping, so one of the two sees the other.
	// The write is under the lock so that it cannot meet shutdown's close
	// of the eventfd.
	if e.sleeping.Load() {
		one := [8]byte{1}
		_, _ = syscall.Write(e.efd, one[:])
	}
	return true
}

// numConns counts the connections the engine holds open.
func (e *ringEngine) numConns() int { return int(e.live.Load()) }

// kick queues c's replies for sending; any goroutine may call it.
func (e *ringEngine) kick(c *srvConn) { e.post(func() { e.kicked = append(e.kicked, c) }) }

// stop closes every connection of the engine and waits for its thread.
func (e *ringEngine) stop() {
	e.post(func() { e.stopping = true })
	<-e.done
}

// adopt takes c's socket over from its goroutine, with any bytes the
// handshake read ahead. It reports false, leaving c as it was, for a
// connection that is not TCP.
func (e *ringEngine) adopt(c *srvConn) bool {
	tc, ok := c.nc.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	fd := -1
	// The duplicate takes a descriptor until the net.Conn's is closed
	// below: the accept loop's refusal on EMFILE must not lose its spare
	// descriptor to it (refuseOne).
	e.s.fdMu.Lock()
	defer e.s.fdMu.Unlock()
	// A duplicate, so that closing the net.Conn takes the socket out of
	// Go's poller while the engine keeps it open.
	if err := raw.Control(func(f uintptr) {
		if r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, f, syscall.F_DUPFD_CLOEXEC, 0); errno == 0 {
			fd = int(r)
		}
	}); err != nil || fd < 0 {
		return false
	}
	rc := &ringConn{fd: fd, c: c, need: 1, in: make([]byte, 0, ringMinRecv)}
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		rc.in = append(rc.in, b...)
	}
	br, w := c.br, c.w
	c.br, c.w, c.rd.r, c.ring, c.rconn = nil, nil, &rc.src, e, rc
	if !e.post(func() { e.incoming = append(e.incoming, rc); e.live.Add(1) }) {
		// The engine has failed or stopped: the goroutine keeps c.
		_ = syscall.Close(fd)
		c.br, c.w, c.rd.r, c.ring, c.rconn = br, w, br, nil, nil
		return false
	}
	_ = tc.Close()
	return true
}

func (e *ringEngine) run() {
	defer close(e.done)
	e.armEvent()
	e.armTick()
	for !e.quit {
		if e.mail.Load() {
			e.takeMail()
			continue
		}
		for _, rc := range e.dirty {
			rc.isDirty = false
			e.send(rc)
		}
		e.dirty = e.dirty[:0]
		if e.retryBudget {
			e.runBudgetWaiters()
		}
		if e.poll() {
			continue
		}
		e.sleeping.Store(true)
		if e.mail.Load() {
			e.sleeping.Store(false)
			continue
		}
		_, err := e.u.Submit(1)
		e.sleeping.Store(false)
		if err != nil && !errors.Is(err, syscall.EBUSY) {
			e.s.log.Error("store server: io_uring failed; closing its connections", "err", err)
			e.shutdown()
			return
		}
		e.u.Reap(e.complete)
	}
}

// poll submits what is queued and polls the ring up to ringSpin times for
// completions, reporting whether it handled any. An error is left for the
// blocking Submit to report.
func (e *ringEngine) poll() bool {
	for range ringSpin {
		if _, err := e.u.Submit(0); err != nil {
			return false
		}
		if e.u.Reap(e.complete) > 0 || e.mail.Load() {
			return true
		}
	}
	return false
}

// takeMail registers handed-over connections, queues kicked replies and
// starts the shutdown.
func (e *ringEngine) takeMail() {
	e.mu.Lock()
	incoming, kicked, finished, stopping := e.incoming, e.kicked, e.finished, e.stopping
	e.incoming, e.kicked, e.finished = nil, nil, nil
	e.mail.Store(false)
	e.mu.Unlock()
	for _, rc := range finished {
		e.offloaded(rc)
	}
	for _, rc := range incoming {
		e.ids++
		rc.id = e.ids
		e.conns[rc.id] = rc
		e.received(rc)
	}
	for _, c := range kicked {
		e.markDirty(c.rconn)
	}
	if stopping {
		e.shutdown()
	}
}

func (e *ringEngine) markDirty(rc *ringConn) {
	if !rc.isDirty && !rc.closing {
		rc.isDirty = true
		e.dirty = append(e.dirty, rc)
	}
}

func (e *ringEngine) armEvent() {
	_ = e.u.Read(e.efd, e.ebuf[:], tagEvent)
}

func (e *ringEngine) armTick() {
	_ = e.u.Timeout(&e.tick, tagTick)
}

func (e *ringEngine) complete(cq uring.CQE) {
	id, tag := cq.UserData>>tagBits, cq.UserData&(1<<tagBits-1)
	if id == 0 {
		switch {
		case e.quit:
		case tag == tagEvent:
			e.armEvent()
		case tag == tagTick:
			e.checkWrites()
			e.retryBudget = true
			e.armTick()
		}
		return
	}
	rc := e.conns[id]
	if rc == nil {
		return
	}
	switch tag {
	case tagRecv:
		rc.recving = false
		switch {
		case rc.closing:
		case cq.Res == 0:
			// The client shut its side down; it still reads the replies
			// to what it sent.
			e.finish(rc, io.EOF)
		case cq.Res < 0:
			e.close(rc, &net.OpError{Op: "read", Net: "tcp", Err: syscall.Errno(-cq.Res)})
		default:
			rc.in = rc.in[:len(rc.in)+int(cq.Res)]
			e.received(rc)
		}
	case tagSend:
		buf := rc.out
		rc.out = nil
		e.s.sending.Add(-int64(len(buf)))
		rc.c.outMu.Lock()
		rc.c.sending = 0
		rc.c.sentLocked(len(buf))
		rc.c.outMu.Unlock()
		if len(e.budgetWait) > 0 {
			e.retryBudget = true
		}
		if cap(buf) <= ringMaxGrow {
			rc.spare = buf[:0]
		}
		switch {
		case rc.closing:
		case cq.Res < 0:
			e.close(rc, fmt.Errorf("write response: %w", &net.OpError{Op: "write", Net: "tcp", Err: syscall.Errno(-cq.Res)}))
		case int(cq.Res) != len(buf):
			e.close(rc, fmt.Errorf("write response: %d of %d bytes sent", cq.Res, len(buf)))
		case rc.ending:
			e.finish(rc, rc.endErr)
		default:
			// Requests held back while the replies were over
			// maxQueuedReplies go on now.
			e.received(rc)
		}
	}
	if rc.closing {
		e.release(rc)
	}
}

// received handles every complete request in rc.in, sends the replies and
// receives more.
func (e *ringEngine) received(rc *ringConn) {
	if err := e.handle(rc); err != nil {
		e.finish(rc, err)
		return
	}
	e.send(rc)
	e.recv(rc)
}

// finish reads no more from rc and closes it with err once the replies
// queued so far are sent: those answer requests that came before the
// end, and the goroutine engine sends them too.
func (e *ringEngine) finish(rc *ringConn, err error) {
	rc.ending, rc.endErr = true, err
	if e.send(rc); rc.out == nil {
		e.close(rc, err)
	}
}

func (e *ringEngine) handle(rc *ringConn) error {
	if rc.busy {
		return nil // offloaded takes the connection up again
	}
	c, b := rc.c, rc.in
	if !rc.detected && len(b) > 0 {
		c.dialect = DialectV1
		if b[0] == 0 { // see serveStream
			if len(b) < 5 {
				e.partial(rc, true)
				return nil
			}
			if uint32(b[1])|uint32(b[2])<<8|uint32(b[3])<<16|uint32(b[4])<<24 == validationMagic {
				c.dialect = DialectV2
				b = b[5:]
			}
		}
		rc.detected, rc.need = true, 1
	}
	rc.held = false
	partial := false
	for rc.detected && len(b) >= rc.need {
		// Requests stop while the connection holds more than its share of
		// replies (a GET is small and its reply may be megabytes), and
		// nothing more is read; they go on after the next send.
		if c.overShare() {
			rc.held = true
			break
		}
		n, need := frameLen(c.dialect, &e.s.opts, b)
		if n == 0 {
			rc.need = need
			partial = true
			break
		}
		if n >= ringOffloadBytes {
			e.offload(rc, b, n)
			return nil
		}
		rc.src.b = b[:n]
		if err := c.handleOne(); err != nil {
			if errors.Is(err, errOverBudget) {
				// The reply does not fit the budget: the request stays
				// in, to run again once memory is released.
				rc.src.b = nil
				rc.held = true
				e.waitBudget(rc)
				break
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("%w: %w", errFrameMismatch, err)
			}
			return err
		}
		if len(rc.src.b) != 0 {
			return errFrameMismatch
		}
		c.paused = false
		rc.src.b = nil
		b = b[n:]
		rc.need = 1
		c.trimScratch()
	}
	if rc.detected && !partial && len(b) > 0 && len(b) < rc.need {
		partial = true
	}
	e.partial(rc, partial)
	rc.in = rc.in[:copy(rc.in, b)]
	return nil
}

// partial records whether rc.in ends in a request not complete yet.
func (e *ringEngine) partial(rc *ringConn, yes bool) {
	switch {
	case !yes:
		rc.partialSince = time.Time{}
	case rc.partialSince.IsZero():
		rc.partialSince = time.Now()
	}
}

// waitBudget parks rc until memory is released.
func (e *ringEngine) waitBudget(rc *ringConn) {
	if !rc.budgetWaiting {
		rc.budgetWaiting = true
		e.budgetWait = append(e.budgetWait, rc)
		if !rc.c.paused { // once per pause, not at every retry
			rc.c.paused = true
			rc.c.logPaused()
		}
	}
}

// runBudgetWaiters runs the connections paused for the budget again: their
// held requests, then their receives.
func (e *ringEngine) runBudgetWaiters() {
	e.retryBudget = false
	waiting := e.budgetWait
	e.budgetWait = nil
	for _, rc := range waiting {
		rc.budgetWaiting = false
		if !rc.closing && !rc.ending {
			e.received(rc)
		}
	}
}

// send starts sending rc's queued replies, one send at a time so that they
// leave in order.
func (e *ringEngine) send(rc *ringConn) {
	if rc.out != nil || rc.closing {
		return
	}
	c := rc.c
	c.outMu.Lock()
	out := c.out
	if len(out) > 0 {
		c.out, rc.spare = rc.spare[:0], nil
	}
	c.outMu.Unlock()
	if len(out) == 0 {
		return
	}
	c.outMu.Lock()
	c.sending = len(out)
	c.settleLocked()
	c.outMu.Unlock()
	rc.out, rc.sentAt = out, time.Now()
	if err := e.u.Send(rc.fd, out, rc.id<<tagBits|tagSend); err != nil {
		rc.out = nil
		e.close(rc, err)
		return
	}
	e.s.sending.Add(int64(len(out)))
}

// recv posts a receive, unless one is posted, the connection is ending,
// or requests wait for replies to drain (handle).
func (e *ringEngine) recv(rc *ringConn) {
	if rc.recving || rc.closing || rc.ending || rc.held || rc.budgetWaiting || rc.busy {
		return
	}
	if len(rc.in) == 0 && cap(rc.in) > ringMaxGrow {
		rc.in = make([]byte, 0, ringMinRecv) // let a large request's buffer go
		e.s.budget.release(rc.inCharged)
		rc.inCharged = 0
	}
	if free := cap(rc.in) - len(rc.in); free < ringMinRecv || rc.need > cap(rc.in) {
		// Grow towards the request's known length, but at most one chunk
		// ahead of the bytes received, so that a length field alone
		// cannot make the server allocate; and only as far as the memory
		// budget allows: past it the connection waits (and FrameTimeout
		// ends a request that never completes).
		grow := min(max(rc.need-len(rc.in), ringMinRecv), ringMaxGrow)
		if !e.s.budget.admit(rc.inCharged, grow) {
			e.waitBudget(rc)
			return
		}
		rc.in = slices.Grow(rc.in, grow)
		if extra := cap(rc.in) - ringMinRecv - rc.inCharged; extra > 0 {
			rc.inCharged += extra
			e.s.budget.charge(extra)
		}
	}
	if err := e.u.Recv(rc.fd, rc.in[len(rc.in):cap(rc.in)], rc.id<<tagBits|tagRecv); err != nil {
		e.close(rc, err)
		return
	}
	rc.recving = true
}

// close ends a connection: its waits are dropped and the socket shut
// down, which completes its receive and send; release then closes it.
func (e *ringEngine) close(rc *ringConn, err error) {
	if rc.closing {
		return
	}
	rc.closing = true
	if err != nil {
		rc.c.logEnd(err)
	}
	e.s.budget.release(rc.inCharged)
	rc.inCharged = 0
	if !rc.busy {
		// A busy connection's request still runs on the state (its
		// session's waits and replies): offloaded tears it down after.
		rc.c.teardown()
	}
	e.retryBudget = true
	_ = syscall.Shutdown(rc.fd, syscall.SHUT_RDWR)
	e.release(rc)
}

// release closes a closing connection's socket once the kernel holds none
// of its buffers.
func (e *ringEngine) release(rc *ringConn) {
	if rc.recving || rc.out != nil || rc.busy {
		return
	}
	if _, ok := e.conns[rc.id]; ok {
		_ = syscall.Close(rc.fd)
		delete(e.conns, rc.id)
		e.live.Add(-1)
	}
}

// checkWrites closes connections whose client has not taken a reply
// within WriteTimeout, or has not finished a request within FrameTimeout.
func (e *ringEngine) checkWrites() {
	limit, frame := e.s.opts.WriteTimeout, e.s.opts.FrameTimeout
	for _, rc := range e.conns {
		switch {
		case rc.closing:
		case rc.out != nil && time.Since(rc.sentAt) > limit:
			e.close(rc, fmt.Errorf("write response: the client read nothing for %v", limit))
		case !rc.partialSince.IsZero() && time.Since(rc.partialSince) > frame:
			e.close(rc, fmt.Errorf("%w: a request began and was not complete after %v", errFrameTimeout, frame))
		}
	}
}

// shutdown closes every connection, waits until the kernel has returned
// their buffers, and closes the ring.
func (e *ringEngine) shutdown() {
	e.mu.Lock()
	incoming := e.incoming
	e.incoming, e.stopped = nil, true
	e.mu.Unlock()
	// The offloaded requests end on their own (they parse bytes already
	// received and run on the state); their mail is refused from now on,
	// so their connections are taken up here.
	e.offloads.Wait()
	for _, rc := range e.conns {
		if rc.busy {
			rc.busy = false
			if rc.closing {
				rc.c.teardown()
			}
		}
	}
	for _, rc := range incoming {
		rc.c.teardown()
		_ = syscall.Close(rc.fd)
		e.live.Add(-1)
	}
	for _, rc := range e.conns {
		e.close(rc, nil)
	}
	// The shutdowns complete every receive and send at once; the tick
	// bounds each wait should one not.
	for deadline := time.Now().Add(5 * time.Second); len(e.conns) > 0 && time.Now().Before(deadline); {
		if _, err := e.u.Submit(1); err != nil && !errors.Is(err, syscall.EBUSY) {
			break
		}
		e.u.Reap(e.complete)
	}
	e.quit = true
	_ = e.u.Close()
	_ = syscall.Close(e.efd)
}

// offload runs the complete request of n bytes at the head of b, the rest
// of rc.in, on a goroutine, so that a large one (a MULTI_SET, MULTI_GET,
// WAIT or CHECK of many keys, or a large value) does not hold every other
// connection of the engine while it is parsed and applied. The request
// runs whole, as on the goroutine engine: its state operation takes st.mu
// once, so a MULTI_SET becomes visible to other clients all at once, as
// on the goroutine engine and torch's single-threaded server (no partial
// visibility), and its wake-ups are those of the same code. rc is held
// meanwhile, no request after this one is handled and nothing more is
// read, so replies stay in order; replies queued before it are sent
// (send takes outMu, as the goroutine's replies do).
func (e *ringEngine) offload(rc *ringConn, b []byte, n int) {
	if off := len(rc.in) - len(b); off > 0 {
		// The request goes to the head of in now: nothing moves the
		// bytes while the goroutine reads them.
		rc.in = rc.in[:copy(rc.in, b)]
	}
	rc.src.b = rc.in[:n]
	rc.busy, rc.busyN, rc.busyErr = true, n, nil
	e.partial(rc, false)
	e.offloads.Add(1)
	go func() {
		defer e.offloads.Done()
		err := rc.c.handleOne()
		if err == nil && len(rc.src.b) != 0 {
			err = errFrameMismatch
		}
		rc.busyErr = err
		// Refused once the engine stops: shutdown then takes rc up.
		e.post(func() { e.finished = append(e.finished, rc) })
	}()
}

// offloaded takes rc up again on the engine's thread once its offloaded
// request has run: as handle does after a request, then the requests
// behind it, the replies and the next receive.
func (e *ringEngine) offloaded(rc *ringConn) {
	rc.busy = false
	c, err := rc.c, rc.busyErr
	rc.src.b = nil
	if rc.closing {
		// Closed meanwhile (a send failed, WriteTimeout, shutdown): the
		// teardown close left for now.
		c.teardown()
		e.release(rc)
		return
	}
	if err != nil {
		if errors.Is(err, errOverBudget) {
			// The reply does not fit the budget: the request stays in,
			// to run again once memory is released.
			rc.held = true
			e.waitBudget(rc)
			return
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: %w", errFrameMismatch, err)
		}
		e.finish(rc, err)
		return
	}
	c.paused = false
	rc.in = rc.in[:copy(rc.in, rc.in[rc.busyN:])]
	rc.need = 1
	c.trimScratch()
	e.received(rc)
}
