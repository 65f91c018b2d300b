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
// op's identity and its completion, about 150 bytes) and the op's record
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
// The fields are in an order that leaves no padding (the 4-byte mutex
// and flag and the 1-byte op last): 128 bytes, a size class below the
// 144 they took, and the handle is the one allocation of a small op.
type handle struct {
	b       *Backend
	seq     uint64
	timeout time.Duration
	enq     time.Duration // issue (Backend.issued: Meta.Issued, else Backend.now); the start of Duration and the timeout
	rec     *work         // the op's record while it is the op's (nil after, or for an op without one); b.mu

	// The completion; mu guards it (but done, which is set once, after res
	// and rerr and end are written), ch and fut.
	res  []*tensor.Tensor
	rerr error
	end  time.Duration     // completion (Backend.now)
	ch   chan struct{}     // closed at completion; made by a waiter that blocks
	fut  *backend.Future   // made by Future
	one  [1]*tensor.Tensor // res of an op of one tensor (allreduceOne)
	mu   sync.Mutex
	done atomic.Bool

	op backend.Op
	// mine says that the goroutine that will Release the handle saw it
	// complete under b.mu, after its record went back to the pool: no
	// goroutine of the backend holds it any more (Release). Written
	// under b.mu by the completing submit or the waiter's drive.
	mine bool
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
// itself. A handle carries its completion in its own fields (done, res,
// err), makes the channel only when a waiter has to block and the Future
// only when asked for; the record embeds its plan and is recycled.
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
	pinv  [1][]byte    // plan.pins' first element: no allocation for one buffer
	descv [1]C.gu_desc // plan.descs', likewise
	slot  int          // the C slab's slot + 1 of a small op (small.go); 0: none
	hs    []handle     // the rest of a chunk of handles (newWork); kept across recycling
}

// handleChunk is how many handles newWork allocates at once: 31 of 128
// bytes, one 4 KiB allocation per 31 ops instead of one per op (the
// handle was a small op's one allocation, and mallocgc with its share of
// the GC's work about 3 % of a 2-rank 8 B op's samples). Why 31, not 32:
// an object with pointers over 512 bytes carries an 8-byte malloc header,
// and 32 handles (4096 + 8 bytes) took the 4864-byte size class, 152
// bytes per op, more than the single handle's 128; 31 (3976 + 8) fit the
// 4096-byte class (TestHandleSize keeps them there).
//
// Why the chunk is the record's: the record belongs to one op from
// newWork until it is recycled, so taking a handle from its chunk needs
// no lock and no atomic (the record is the op's alone while it plans);
// a chunk that runs out is replaced, and the old one lives on in the
// handles callers still hold.
//
// The cost: a handle a caller keeps keeps its whole chunk alive (4 KiB
// for one 128-byte handle, the other 30 handles' fields included, with
// whatever their res still references until they are collected with it).
// That is acceptable: callers keep few works for long, a handle's res is
// the caller's own tensors, and handles do not reference their records
// once these are recycled.
const handleChunk = 31

// newHandle makes the handle of op m.
func (b *Backend) newHandle(op backend.Op, m backend.Meta) *handle {
	return &handle{b: b, op: op, seq: m.Seq, timeout: m.Timeout}
}

// newWork makes the record and handle of op m and its plan (outputs: what
// the Future gives), the record from the pool when one is there. enq is
// taken by submit.
func (b *Backend) newWork(op backend.Op, m backend.Meta, outputs []*tensor.Tensor) *work {
	w, _ := b.recs.Get().(*work)
	if w == nil {
		w = new(work)
	}
	h, _ := b.handles.Get().(*handle) // zero (Release)
	if h == nil {
		if len(w.hs) == 0 {
			w.hs = make([]handle, handleChunk)
		}
		h = &w.hs[0] // zero: each handle of a chunk is handed out once
		w.hs = w.hs[1:]
	}
	h.b, h.op, h.seq, h.timeout = b, op, m.Seq, m.Timeout
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
func (h *handle) complete(res []*tensor.Tensor, err error) bool {
	h.mu.Lock()
	if h.done.Load() {
		h.mu.Unlock()
		return false
	}
	h.res, h.rerr, h.end = res, err, h.b.now()
	h.done.Store(true)
	ch, fut := h.ch, h.fut
	h.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if fut != nil {
		fut.Complete(res, err)
	}
	return true
}

// completeFresh is complete(res, nil) for an op that finished within its
// submit: nothing else has the handle yet (submit holds b.mu, and the work
// is in neither b.pending nor the watchdog), so no waiter's channel or
// Future can exist and no other completer can race; the lock pair is a
// good part of what completing costs at 8 B.
func (h *handle) completeFresh(res []*tensor.Tensor) {
	h.res, h.end = res, h.b.now()
	h.done.Store(true)
	h.mine = true // its record is recycled next (a fresh op is not watched)
}

// doneCh is the channel closed at completion, made on first use.
func (h *handle) doneCh() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ch == nil {
		h.ch = make(chan struct{})
		if h.done.Load() {
			close(h.ch)
		}
	}
	return h.ch
}

// IsCompleted reports whether the work's op has completed.
func (w *work) IsCompleted() bool { return w.h.done.Load() }

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
		return h.rerr
	}
	if start.IsZero() {
		start = time.Now()
	}
	select {
	case <-h.doneCh():
		return h.rerr
	case <-ctx.Done():
		return &backend.WaitError{Op: h.op.String(), Seq: h.seq, Rank: h.b.cfg.Rank, Backend: Name, Timeout: h.timeout,
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
	return h.rerr
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
//     failed or a caller that blocked or asked for them makes.
func (h *handle) Release() {
	b := h.b
	if !h.mine || h.rerr != nil || h.ch != nil || h.fut != nil || b.holds.Load() > 0 {
		return
	}
	*h = handle{}
	b.handles.Put(h)
}

// BlockStream implements backend.Work: with no stream to order, it blocks
// the host.
func (h *handle) BlockStream(backend.Stream) error { return h.Wait(context.Background()) }

// IsCompleted implements backend.Work.
func (h *handle) IsCompleted() bool { return h.done.Load() }

// IsStarted implements backend.Work: a work exists once posted.
func (h *handle) IsStarted() (bool, error) { return true, nil }

// Exception implements backend.Work.
func (h *handle) Exception() error {
	if !h.done.Load() {
		return nil
	}
	return h.rerr
}

// Future implements backend.Work; the Future is made on first use.
func (h *handle) Future() *backend.Future {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fut == nil {
		h.fut = backend.NewFuture()
		if h.done.Load() {
			h.fut.Complete(h.res, h.rerr)
		}
	}
	return h.fut
}

// SeqNum implements backend.Work.
func (h *handle) SeqNum() uint64 { return h.seq }

// Duration implements backend.Work: from issue to completion.
func (h *handle) Duration() (time.Duration, error) {
	if !h.done.Load() {
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
	if !h.done.Load() {
		return 0, 0, false, nil
	}
	return h.end, h.end - h.enq, true, h.rerr
}

// Abort implements backend.Work: it fails this op with ErrAborted (UCC
// cannot cancel the requests, which stay posted, as after a timeout).
func (h *handle) Abort(reason error) {
	if h.done.Load() {
		return
	}
	h.complete(nil, fmt.Errorf("%w: %w", backend.ErrAborted, reason))
}
