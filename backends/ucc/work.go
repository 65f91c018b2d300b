package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// An op is two objects: the handle the caller gets (the backend.Work: the
// op's identity and its completion, 64 bytes) and the op's record
// (work: its plan, UCC requests, pins and place in the fingerprint check,
// about 450 bytes more), which the backend alone holds.
//
// Why two: the record is needed only while the op is on its way through
// the check and UCC; the handle lives as long as the caller keeps it
// (an async op's caller may keep it for good). The record goes back to the
// backend's pool (Backend.recs) as soon as the op has left UCC and
// completed, so that an allreduce of one tensor allocates only the handle:
// allocating and first touching a fresh 640-byte work per op was a quarter
// of the Go cost of an 8 B allreduce, and its garbage a GC every few
// thousand ops that moved the spinning goroutine to another thread. The
// handles themselves come from chunks (handleChunk), or back from the
// dispatcher's blocking forms (handle.Release), which allocate nothing.
// Everything a caller can ask of an old handle (Exception, Future,
// Duration, SeqNum, Wait) is the handle's own, so a recycled record cannot
// change it.
//
// A record stays out of the pool, and goes to the garbage collector
// instead, when anything but b.mu's structures may still point at it: the
// watchdog (watched), which reads it after b.mu is released.
//
// The pool, not a spare slot taken with an atomic swap: a Get and Put on
// the same P (the issuing goroutine completes a small op in its submit
// or its Wait) take no locked instruction, and measured 14 ns a pair
// against the slot's 22 (swap and compare-and-swap) on the dev machine.

// handle is an op's backend.Work.
//
// It is 64 bytes, the size class below the 128 it took: a small async
// op's one allocation (the blocking forms give theirs back, Release), and
// at two ranks on two cores the garbage collections that allocation
// drives were most of what an async 8 B op cost over a blocking one
// (each collection's workers take a core from a spinning rank for a
// scheduler slice while its peer waits). So what few ops need is in the
// handle's extra (handleExtra), made on demand: several results, an
// error, a caller that blocks, a Future, a timeout not the group's.
type handle struct {
	b   *Backend
	rec *work // the op's record while it is the op's (nil after, or for an op without one); b.mu
	// x is made at most once (ext), by newWork or by the first that needs it.
	x   atomic.Pointer[handleExtra]
	res *tensor.Tensor // the result of an op of one tensor, once completed (the results of several: x.res)
	seq uint64
	enq time.Duration // issue (Backend.issued: Meta.Issued, else Backend.now); the start of Duration and the timeout
	end time.Duration // completion (Backend.now)
	// state is hLive, hCompleting (one completer won, and writes res, x.err
	// and end) or hDone (they are written; read them only after).
	state atomic.Uint32
	op    backend.Op
	// mine says that the goroutine that will Release the handle saw it
	// complete under b.mu, after its record went back to the pool: no
	// goroutine of the backend holds it any more (Release). Written
	// under b.mu by the completing submit or the waiter's drive.
	mine bool
}

// The states of a handle.
const (
	hLive uint32 = iota
	hCompleting
	hDone
)

// handleExtra is the part of a handle that few ops need (handle says
// why it is apart).
type handleExtra struct {
	timeout    time.Duration // the op's timeout, when ownTimeout
	ownTimeout bool          // the op's timeout is not the group's (Config.Timeout)
	res        []*tensor.Tensor
	err        error // the op's error; written by its completer before hDone

	// mu guards the rest. ch is closed, and fut completed, once: by the
	// completer when it finds them made, or by their maker when it finds
	// the op completed (complete and doneCh say why one of the two does).
	mu       sync.Mutex
	ch       chan struct{}
	fut      *backend.Future
	closed   bool // ch is closed
	futGiven bool // fut has the outcome
}

var (
	_ backend.Work            = (*handle)(nil)
	_ backend.OutcomeReporter = (*handle)(nil)
)

// work is an op's record: the UCC requests it posted (several for a list
// of tensors or a coalesced form, one Work for them all), what to do with
// the results, and the pins of the host buffers UCC points into.
//
// A work completes (its handle does) once: when UCC has finished every
// request (after runs first), or earlier when it fails (timeout, a peer's
// abort, Abort). A work failed early stays in Backend.pending while a
// request is still posted: the progress goroutine finalises the requests
// if they ever finish, and only then unpins the buffers.
//
// Why not backend.HostWork: an op of a few bytes costs the raw libucc loop
// under a microsecond, and a HostWork is three allocations (itself, its
// Future, the Future's channel) and a clock read more than the work
// itself. A handle carries its completion in its own fields (state, res,
// end; an error in its extra), makes the channel only when a waiter has to
// block and the Future only when asked for; the record embeds its plan and
// is recycled.
type work struct {
	plan
	h       *handle
	watched bool // in b.wd (the progress goroutine enqueues works that outlive a tick); b.mu

	reqs  []C.uintptr_t // 0 once finalised
	reqv  [1]C.uintptr_t
	live  int       // requests not yet finalised, as far as Go knows; b.mu
	err   error     // the first request that failed in UCC
	cerr  C.int     // its status, as gu_reap and gu_drive record it
	at    C.int     // gu_coll_start's report: which collective failed,
	post  C.int     // and whether in its post
	deps  []*handle // a barrier's earlier ops
	fpw   fpWork    // its part in the fingerprint check (fingerprint.go); b.mu
	pin   runtime.Pinner
	pinv  [1][]byte         // plan.pins' first element: no allocation for one buffer
	descv [1]C.gu_desc      // plan.descs', likewise
	outv  [1]*tensor.Tensor // plan.outputs of an op of one tensor (allreduceOne)
	slot  int               // the C slab's slot + 1 of a small op (small.go); 0: none
	hs    []handle          // the rest of a chunk of handles (newWork); kept across recycling
}

// handleChunk is how many handles newWork allocates at once: 63 of 64
// bytes, one 4 KiB allocation per 63 ops instead of one per op (the
// handle was a small op's one allocation, and mallocgc with its share of
// the GC's work about 3 % of a 2-rank 8 B op's samples). Why 63, not 64:
// an object with pointers over 512 bytes carries an 8-byte malloc header,
// and 64 handles (4096 + 8 bytes) would take the 4864-byte size class;
// 63 (4032 + 8) fit the 4096-byte class, 65 bytes per op
// (TestHandleSize keeps them there).
//
// Why the chunk is the record's: the record belongs to one op from
// newWork until it is recycled, so taking a handle from its chunk needs
// no lock and no atomic (the record is the op's alone while it plans);
// a chunk that runs out is replaced, and the old one lives on in the
// handles callers still hold.
//
// The cost: a handle a caller keeps keeps its whole chunk alive (4 KiB
// for one 64-byte handle, the other 62 handles' fields included, with
// whatever their res still references until they are collected with it).
// That is acceptable: callers keep few works for long, a handle's res is
// the caller's own tensors, and handles do not reference their records
// once these are recycled.
const handleChunk = 63

// newHandle makes the handle of op m.
func (b *Backend) newHandle(op backend.Op, m backend.Meta) *handle {
	h := &handle{b: b, op: op, seq: m.Seq}
	h.setTimeout(m.Timeout)
	return h
}

// setTimeout keeps the op's timeout, in its extra when it is not the
// group's. Only while the handle is the op's alone. A handle given back
// may carry the extra of its last op's own timeout (Release), which is
// reused here or dropped.
func (h *handle) setTimeout(d time.Duration) {
	x := h.x.Load()
	switch {
	case d == h.b.cfg.Timeout:
		if x != nil {
			h.x.Store(nil)
		}
	case x != nil:
		x.timeout = d
	default:
		h.x.Store(&handleExtra{timeout: d, ownTimeout: true})
	}
}

// timeoutOnly reports whether the extra holds nothing but the op's own
// timeout. Only once nothing but the caller can reach the handle.
func (x *handleExtra) timeoutOnly() bool {
	return x.err == nil && x.res == nil && x.ch == nil && x.fut == nil
}

// timeout is the op's timeout (Meta.Timeout).
func (h *handle) timeout() time.Duration {
	if x := h.x.Load(); x != nil && x.ownTimeout {
		return x.timeout
	}
	return h.b.cfg.Timeout
}

// ext returns the handle's extra, made now if there is none.
func (h *handle) ext() *handleExtra {
	if x := h.x.Load(); x != nil {
		return x
	}
	x := new(handleExtra)
	if h.x.CompareAndSwap(nil, x) {
		return x
	}
	return h.x.Load()
}

// err is the op's error; only once IsCompleted.
func (h *handle) err() error {
	if x := h.x.Load(); x != nil {
		return x.err
	}
	return nil
}

// results are the op's results; only once IsCompleted.
func (h *handle) results() []*tensor.Tensor {
	if h.res != nil {
		return []*tensor.Tensor{h.res}
	}
	if x := h.x.Load(); x != nil {
		return x.res
	}
	return nil
}

// newWork makes the record and handle of op m and its plan (outputs: what
// the Future gives), the record from the pool when one is there. enq is
// taken by submit.
func (b *Backend) newWork(op backend.Op, m backend.Meta, outputs []*tensor.Tensor) *work {
	w, _ := b.recs.Get().(*work)
	if w == nil {
		w = new(work)
	}
	var h *handle
	if b.released.Load() {
		// Only when Release gave one back: an empty pool's Get looks
		// through every P's pool (62 ns at 16 Ps, 20 at 2), and an async
		// loop, whose handles are never given back, would pay it per op.
		if h, _ = b.handles.Get().(*handle); h == nil { // zero (Release)
			b.released.Store(false)
		}
	}
	if h == nil {
		if len(w.hs) == 0 {
			w.hs = make([]handle, handleChunk)
		}
		h = &w.hs[0] // zero: each handle of a chunk is handed out once
		w.hs = w.hs[1:]
	}
	h.b, h.op, h.seq = b, op, m.Seq
	h.setTimeout(m.Timeout)
	w.h, h.rec = h, w
	// Field by field: a record is zero (new, or cleared by recycleLocked),
	// and a plan literal wrote all ~200 bytes of the plan again, with
	// write barriers while the GC runs (3 % of a 2-rank 8 B op's samples).
	p := &w.plan
	p.b, p.w, p.op, p.m, p.outputs, p.descs, p.pins = b, w, op, m, outputs, w.descv[:0], w.pinv[:0]
	return w
}

// recycleLocked hands w back to the pool once it has left UCC and its
// handle has completed, unless the watchdog may still read it. b.mu is
// held: the handle's rec is cleared under it, as drive reads it.
func (w *work) recycleLocked() {
	if w.watched {
		return
	}
	b := w.b
	w.h.rec = nil
	pin, hs := w.pin, w.hs // pin is unpinned (testLocked); its backing store is kept for the next op
	*w = work{pin: pin, hs: hs}
	b.recs.Put(w)
}

// complete finishes the op with (res, err) unless it has finished; it
// reports whether this call finished it.
//
// Why ch and fut need no lock taken first: the state is stored before
// x is loaded here, and x is stored before the state is loaded in doneCh
// and Future (all sequentially consistent), so either this call finds
// the extra its waiter made, or the waiter finds the op done; x.mu then
// lets one of the two close ch and complete fut.
func (h *handle) complete(res []*tensor.Tensor, err error) bool {
	if !h.state.CompareAndSwap(hLive, hCompleting) {
		return false
	}
	h.setResults(res, err)
	h.end = h.b.now()
	h.state.Store(hDone)
	x := h.x.Load()
	if x == nil {
		return true
	}
	var ch chan struct{}
	var fut *backend.Future
	x.mu.Lock()
	if x.ch != nil && !x.closed {
		ch, x.closed = x.ch, true
	}
	if x.fut != nil && !x.futGiven {
		fut, x.futGiven = x.fut, true
	}
	x.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if fut != nil {
		fut.Complete(h.results(), err)
	}
	return true
}

// setResults writes the op's outcome; by its completer, before hDone.
func (h *handle) setResults(res []*tensor.Tensor, err error) {
	if err != nil {
		h.ext().err = err
		return
	}
	if len(res) == 1 {
		h.res = res[0]
	} else if len(res) > 1 {
		h.ext().res = res
	}
}

// completeFresh is complete(res, nil) for an op that finished within its
// submit: nothing else has the handle yet (submit holds b.mu, and the work
// is in neither b.pending nor the watchdog), so no waiter's channel or
// Future can exist and no other completer can race; the compare-and-swap
// and the look at x are a good part of what completing costs at 8 B.
func (h *handle) completeFresh(res []*tensor.Tensor) {
	h.setResults(res, nil)
	h.end = h.b.now()
	h.state.Store(hDone)
	h.mine = true // its record is recycled next (a fresh op is not watched)
}

// doneCh is the channel closed at completion, made on first use.
func (h *handle) doneCh() chan struct{} {
	x := h.ext()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ch == nil {
		x.ch = make(chan struct{})
	}
	if !x.closed && h.IsCompleted() {
		x.closed = true
		close(x.ch)
	}
	return x.ch
}

// IsCompleted reports whether the work's op has completed.
func (w *work) IsCompleted() bool { return w.h.IsCompleted() }

// fail completes the work with err, if it has not completed; its requests
// stay posted until UCC finishes them.
func (w *work) fail(err error) { w.h.complete(nil, err) }

// testLocked finalises the requests UCC has finished and reports whether
// the work has left UCC (and its barrier dependencies are complete); it
// then completes the work, unless it failed before, and recycles the
// record: the caller must not use w after true. fresh says that the
// caller is the op's submit, before the handle went to anyone (so the
// completion needs no lock: handle.completeFresh). b.mu is held.
func (w *work) testLocked(fresh bool) bool {
	if w.fpw.held || w.reap() {
		return false
	}
	if w.fpw.ahead {
		// Posted ahead of its check (fpahead.go): on the shared-memory
		// board it completes now, its check to follow (lazy); elsewhere
		// only once the peers' slots are read.
		if w.b.fp.lazy {
			w.b.fpUncheckedLocked(w)
		} else if w.b.fpVerifyLocked(); w.fpw.ahead {
			return false
		}
	}
	for _, d := range w.deps {
		if !d.IsCompleted() {
			return false
		}
	}
	if w.deps != nil {
		w.b.holds.Add(-1)
	}
	w.deps = nil
	if len(w.pins) > 0 || len(w.arrs) > 0 {
		w.pin.Unpin() // a small op through the C slab pinned nothing
	}
	w.pins, w.arrs = nil, nil
	if w.slot != 0 {
		w.b.smallDoneLocked(w, true)
	}
	h := w.h
	if !h.IsCompleted() {
		if w.err != nil {
			h.complete(nil, &backend.OpError{Op: h.op.String(), Seq: h.seq, Rank: w.b.cfg.Rank, Backend: Name, Kind: backend.ErrRemote, Err: w.err,
				Detail: "UCC failed the collective"})
		} else {
			if w.after != nil {
				w.after()
			}
			if fresh {
				h.completeFresh(w.outputs)
			} else {
				h.complete(w.outputs, nil)
			}
		}
	}
	w.recycleLocked()
	return true
}

// reap finalises the requests UCC has finished (one cgo crossing for them
// all; none when gu_drive has finalised them all) and reports whether any
// is still in progress. b.mu is held.
func (w *work) reap() (busy bool) {
	if w.live == 0 {
		return false
	}
	n := int(C.gu_reap(&w.reqs[0], C.int(len(w.reqs)), &w.cerr))
	w.noteErr()
	w.live = n
	return n > 0
}

// noteErr turns the first failed status C recorded into w.err.
func (w *work) noteErr() {
	if w.cerr != 0 && w.err == nil {
		w.err = &Error{Call: "ucc_collective_test", Status: int(w.cerr)}
	}
}

// fail completes the op with err, if it has not completed.
func (h *handle) fail(err error) { h.complete(nil, err) }

// WaitHost implements backend.Work. When ctx ends first, the error (a
// *backend.WaitError) names the op and says that the caller's deadline
// fired, and whether the op's own timeout had passed.
func (h *handle) WaitHost(ctx context.Context) error {
	var start time.Time
	if !h.IsCompleted() {
		// Its clock read, not one here: most waits need none.
		start = h.b.drive(ctx, h)
	}
	if h.IsCompleted() {
		return h.err()
	}
	if start.IsZero() {
		start = time.Now()
	}
	select {
	case <-h.doneCh():
		return h.err()
	case <-ctx.Done():
		return &backend.WaitError{Op: h.op.String(), Seq: h.seq, Rank: h.b.cfg.Rank, Backend: Name, Timeout: h.timeout(),
			Waited: time.Since(start), Elapsed: h.b.now() - h.enq, Err: ctx.Err()}
	}
}

// Wait implements backend.Work: it progresses UCC itself for a while
// (drive.go), then blocks until the op completes.
func (h *handle) Wait(ctx context.Context) error {
	if !h.IsCompleted() {
		h.b.drive(ctx, h)
	}
	if !h.IsCompleted() {
		<-h.doneCh()
	}
	return h.err()
}

// Release implements backend.Releaser: the dispatcher's blocking forms
// give back the handle of an op that succeeded, and the next op's newWork
// takes it from b.handles instead of a chunk, so that a loop of blocking
// small ops allocates nothing. It is ignored unless nothing of the backend
// can still reach the handle:
//   - mine: it completed in its own submit, or its waiter saw it complete
//     under b.mu (drive), after its record was recycled; a record the
//     watchdog took keeps its handle, and a handle the progress goroutine
//     completed while the caller blocked is left to the garbage collector
//     (that goroutine may still be inside complete);
//   - no pending barrier holds handles of earlier ops (b.holds);
//   - it carries no error, channel or Future, which only an op that
//     failed or a caller that blocked or asked for them makes. An extra
//     that holds only the op's own timeout stays with the handle, for
//     the next op's: a blocking loop with a timeout of its own allocates
//     nothing either.
func (h *handle) Release() {
	b := h.b
	x := h.x.Load()
	if !h.mine || (x != nil && !x.timeoutOnly()) || b.holds.Load() > 0 {
		return
	}
	*h = handle{}
	if x != nil {
		h.x.Store(x) // for the next op's own timeout (setTimeout)
	}
	b.handles.Put(h)
	if !b.released.Load() {
		b.released.Store(true)
	}
}

// BlockStream implements backend.Work: with no stream to order, it blocks
// the host.
func (h *handle) BlockStream(backend.Stream) error { return h.Wait(context.Background()) }

// IsCompleted implements backend.Work.
func (h *handle) IsCompleted() bool { return h.state.Load() == hDone }

// IsStarted implements backend.Work: a work exists once posted.
func (h *handle) IsStarted() (bool, error) { return true, nil }

// Exception implements backend.Work.
func (h *handle) Exception() error {
	if !h.IsCompleted() {
		return nil
	}
	return h.err()
}

// Future implements backend.Work; the Future is made on first use.
func (h *handle) Future() *backend.Future {
	x := h.ext()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fut == nil {
		x.fut = backend.NewFuture()
	}
	if !x.futGiven && h.IsCompleted() {
		x.futGiven = true
		x.fut.Complete(h.results(), x.err)
	}
	return x.fut
}

// SeqNum implements backend.Work.
func (h *handle) SeqNum() uint64 { return h.seq }

// Duration implements backend.Work: from issue to completion.
func (h *handle) Duration() (time.Duration, error) {
	if !h.IsCompleted() {
		return 0, errors.New("duration requested before the op completed")
	}
	return h.end - h.enq, nil
}

// Outcome implements backend.OutcomeReporter: it tells, in one call, what
// the flight recorder and the metrics note of a completed op: when it
// completed on the backend.Mono clock (0, with the rest zero, before it
// has), its Duration and its Exception. Why: a Work without it is one
// the dispatcher cannot look at on the host, so the recorder kept every
// op's handle until its poll and the metrics handed each to their
// follower goroutine, and no blocking form ever gave its handle back
// (Release): at two ranks, 8 B through conftest bench, the recorder on,
// an allocation per op and its garbage collections.
func (h *handle) Outcome() (at, dur time.Duration, timed bool, err error) {
	if !h.IsCompleted() {
		return 0, 0, false, nil
	}
	return h.end, h.end - h.enq, true, h.err()
}

// Abort implements backend.Work: it fails this op with ErrAborted (UCC
// cannot cancel the requests, which stay posted, as after a timeout).
func (h *handle) Abort(reason error) {
	if h.IsCompleted() {
		return
	}
	h.complete(nil, fmt.Errorf("%w: %w", backend.ErrAborted, reason))
}
