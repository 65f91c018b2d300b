package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/tensor"
)

// Work is the NCCL backend's backend.Work (PyTorch's WorkNCCL): an end
// event recorded after the kernel on the stream the op ran on, a start
// event when timing is on, and, in async mode, the stash of the op's
// tensors.
//
// Completion is an event query: "completed" means the kernel finished on
// the device, whatever the host or the current stream did. Once a query
// (by the caller or the watchdog) has seen completion, the events go back
// to the communicator's pool and the outcome is remembered.
type Work struct {
	b *Backend
	c *comm
	// freshNext links the work to the one launched before it while both
	// are in c's fresh list (comm.fresh); written by the pusher before
	// the push, then by the flush under b.mu.
	freshNext *Work
	seq       uint64
	timeout   time.Duration
	enq       time.Duration // the op's start (issuedAt), a backend.Mono reading
	stream    *cuda.Stream  // the stream the kernel is on
	lseq      uint64        // its number among c's launches (comm.launches)

	// The small fields, together (the Work is 144 bytes, a size class of
	// its own). Set before the Work is published, never changed after.
	op      backend.Op
	async   bool // an async op: Wait orders ctx's current stream (when not w.stream) and releases the stash
	barrier bool // Wait also blocks the host on the current stream
	timing  bool // the op has a start event (EnableTiming)
	// captured: the op was captured into a CUDA graph, not run. It runs
	// at each replay of the graph, ordered by the stream the graph is
	// launched on, and it is neither complete nor failed nor pending:
	// queries of its events fail or mean nothing (they were recorded
	// during the capture), so nothing queries them. The watchdog never
	// sees it (ProcessGroupNCCL skips workEnqueue the same way), the
	// flight recorder leaves it alone (backend.CaptureReporter), and its
	// host waits return at once. Its events stay with it, never back in
	// the pool: the graph records them at each replay.
	captured bool
	// fresh: launchOne queued the work in its communicator's fresh list,
	// from where it reaches the unit (comm.fresh), rather than leaving
	// enqueue to hand it over.
	fresh bool
	// nstash is how many of stash below hold a tensor.
	nstash uint8

	// state is 0 while the op is pending, then workDone (completed on the
	// device) or workFailed, never changed after; while pending, workPinned
	// is set while a holder of mu uses the end event, and workFut once a
	// Future was made. The word owns the end event: whoever moves it from
	// pending to done returns the event to the pool, and nobody touches
	// the event once it is finished. So early retirement completes a work
	// with one compare-and-swap from exactly 0, with no lock
	// (completeInOrderTo); a holder of mu that queries or waits on the
	// event pins it first (pin), which makes that swap fail until it
	// unpins, and a work with a Future (workFut) is always completed under
	// mu, which completes the Future.
	state atomic.Uint32
	// taken: the stash below was taken. The stash is written by the
	// issuing goroutine before the Work is published (returned, or handed
	// to the watchdog), then owned by whoever turns taken from false to
	// true (Wait, the watchdog, an early-retirement sweep, Close): that
	// one reads and clears it, with no lock, so that Wait on the op's own
	// stream takes no mutex. False at first (the zero Work), so that the
	// issue makes no atomic store.
	taken atomic.Bool

	mu sync.Mutex // guards lx, ix's start and dur, and pins (see state)
	// end is the op's end event: set before the Work is published and
	// owned by state after (see there); nil once a locked completion
	// returned it to the pool.
	end *cuda.Event
	// ix holds what only some ops have (outputs, a start event, more than
	// two stashed tensors), set before the Work is published; nil for
	// most. lx holds what a failure or a Future adds, made under mu. Out
	// of the Work, they made it 160 bytes where it was 240 (144 since the
	// enqueue time is a Mono reading and not a time.Time): a third less
	// memory to allocate, zero and scan per op (the Work slab's allocation
	// was ~7 % of the backend call's samples on nvidia-h200, session 5).
	ix *workIssue
	lx *workLate

	stash [2]cuda.Retainer // the common case (one tensor, or an input and an output) without an allocation
}

// workIssue is the part of a Work that only some ops have, written before
// the Work is published; start and dur are under Work.mu after that.
type workIssue struct {
	outputs []*tensor.Tensor
	start   *cuda.Event
	dur     time.Duration
	more    []cuda.Retainer // stashed tensors past the Work's two
}

// workLate is what a failure or a Future adds to a Work, under Work.mu.
type workLate struct {
	err error
	fut *backend.Future
}

// issue returns w's workIssue, made if need be; only before w is
// published.
func (w *Work) issue() *workIssue {
	if w.ix == nil {
		w.ix = &workIssue{}
	}
	return w.ix
}

// outputs are the op's outputs, for its Future.
func (w *Work) outputs() []*tensor.Tensor {
	if w.ix == nil {
		return nil
	}
	return w.ix.outputs
}

// startEv is the op's start event (EnableTiming), or nil. w.mu is held,
// or w is not published yet.
func (w *Work) startEv() *cuda.Event {
	if w.ix == nil {
		return nil
	}
	return w.ix.start
}

// enqTime is the op's start as a time.Time, for the watchdog unit and
// errors (rare paths: the hot path keeps the Mono reading).
func (w *Work) enqTime() time.Time { return backend.MonoTime(w.enq) }

// more is the stash past its first two tensors.
func (w *Work) more() []cuda.Retainer {
	if w.ix == nil {
		return nil
	}
	return w.ix.more
}

// errLocked is the op's error; w.mu is held.
func (w *Work) errLocked() error {
	if w.lx == nil {
		return nil
	}
	return w.lx.err
}

// futLocked is the op's Future, if one was asked for; w.mu is held.
func (w *Work) futLocked() *backend.Future {
	if w.lx == nil {
		return nil
	}
	return w.lx.fut
}

// late returns w's workLate, made if need be; w.mu is held.
func (w *Work) late() *workLate {
	if w.lx == nil {
		w.lx = &workLate{}
	}
	return w.lx
}

// The states of Work.state after pending (0), and the flags of a pending
// one.
const (
	workDone   = 1
	workFailed = 2
	workStatus = workDone | workFailed
	workPinned = 4 // pending, and a holder of mu uses the end event
	workFut    = 8 // pending, with a Future to complete (under mu)
)

// isFinished reports whether w completed or failed: the watchdog can drop
// it.
func (w *Work) isFinished() bool { return w.state.Load()&workStatus != 0 }

// isDone reports whether w completed on the device.
func (w *Work) isDone() bool { return w.state.Load()&workStatus == workDone }

// pin marks w's end event in use while w is pending and reports whether it
// was pending; w.mu is held (so there is one pinner at a time), and the
// caller unpins, or finishes w, before it unlocks. A false result means
// that w is finished: its end event may be back in the pool, and must not
// be touched.
func (w *Work) pin() bool {
	for {
		s := w.state.Load()
		if s&workStatus != 0 {
			return false
		}
		if w.state.CompareAndSwap(s, s|workPinned) {
			return true
		}
	}
}

// unpin ends pin while w is still pending; w.mu is held. No one else
// changes a pinned state: the lock-free completer swaps from 0 only, and
// every other writer holds mu.
func (w *Work) unpin() { w.state.Store(w.state.Load() &^ workPinned) }

var _ backend.Work = (*Work)(nil)
var _ backend.CaptureReporter = (*Work)(nil)

// Captured implements backend.CaptureReporter: whether the op was captured
// into a CUDA graph rather than run.
func (w *Work) Captured() bool { return w.captured }

// enqueueCaptured is enqueue for an op that was captured into a graph: it
// gives w the captured state instead of handing it to the watchdog, and
// releases the stashes freed since the last op as enqueue does.
func (b *Backend) enqueueCaptured(w *Work) {
	w.captured = true
	b.enqueue(nil)
}

// stashTensors takes a reference on every tensor's device memory, so that
// freeing the tensor before Wait defers the free (PyTorch's TensorShelf).
// Memory whose free is queued on the op's own stream needs none (an op
// on the current stream, Options.AsyncOnCurrentStream, of tensors
// allocated there: the training loop's case): the free, and any reuse,
// come after the op in that stream's order (cuda.Buffer.FreedInOrderOn).
// That saves two atomic operations per tensor and Wait's take of the
// stash. The issuing goroutine calls it before publishing w.
func (w *Work) stashTensors(ts []*tensor.Tensor) {
	for _, t := range ts {
		m := t.Memory()
		if b, ok := m.(*cuda.Buffer); ok && b.FreedInOrderOn(w.stream) {
			continue
		}
		r, ok := m.(cuda.Retainer)
		if !ok {
			continue
		}
		r.Retain()
		if int(w.nstash) < len(w.stash) {
			w.stash[w.nstash] = r
			w.nstash++
		} else {
			x := w.issue()
			x.more = append(x.more, r)
		}
	}
}

// appendStash removes the stash, appending it to dst, if no one took it
// before: Wait passes an array on its stack, so that the common case (up
// to two tensors) releases without allocating. It needs no lock: the
// swap of taken makes the caller its one owner.
func (w *Work) appendStash(dst []cuda.Retainer) []cuda.Retainer {
	// Only async ops stash, and not every one (stashTensors). nstash and
	// more are written before w is published and never after.
	if !w.async || (w.nstash == 0 && len(w.more()) == 0) || w.taken.Load() || w.taken.Swap(true) {
		return dst
	}
	dst = append(dst, w.stash[:w.nstash]...)
	dst = append(dst, w.more()...)
	// Drop the references; nstash and more's length stay as they were,
	// for stashHeld's readers (taken says the stash is gone).
	clear(w.stash[:w.nstash])
	clear(w.more())
	return dst
}

// stashHeld is how many tensors the stash holds: 0 once it was taken.
func (w *Work) stashHeld() int {
	if w.taken.Load() {
		return 0
	}
	return int(w.nstash) + len(w.more())
}

// releaseStash releases the stash now, if no one took it before (after a
// stream wait, as synchronizeStream does: the order is the whole of the
// safety).
//
// A work that stashed nothing (an op on the current stream of tensors
// allocated there: the training loop's case) returns at once, in a check
// small enough to inline into Wait and early retirement.
func (w *Work) releaseStash() {
	if w.nstash == 0 && w.ix == nil {
		return
	}
	w.releaseStashSlow()
}

// releaseStashSlow is releaseStash past its inlined check.
func (w *Work) releaseStashSlow() {
	var buf [len(w.stash)]cuda.Retainer
	for _, r := range w.appendStash(buf[:0]) {
		r.Release()
	}
}

// poll queries the end event and records completion. It reports whether
// the work is finished (completed or failed), or captured: then there is
// nothing for the host to wait for, and its events are not queried.
func (w *Work) poll() bool {
	if w.isFinished() || w.captured {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.pin() {
		return true
	}
	ok, err := w.end.Query()
	if err != nil {
		w.failLocked(&backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: w.b.rank, Backend: Name, Kind: backend.ErrAborted, Err: err})
		return true
	}
	if !ok {
		w.unpin()
		return false
	}
	w.completeLocked()
	return true
}

// completeInOrder marks w completed without a query, because a work
// launched after it on its stream has been seen completed. It reports
// whether w is finished (it may have failed meanwhile, which stands).
func (w *Work) completeInOrder() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pin() {
		w.completeLocked()
	}
	return true
}

// completeInOrderTo is completeInOrder that appends w's events to evs for
// the caller to return to the pool, all at once, instead of returning them
// itself. A pending work without a start event or a Future (the common
// case) takes no lock: one swap of its state from 0 to done makes the
// caller the owner of its end event (see Work.state). A pinned one, one
// with a Future (completed under mu) or a timed one (its duration needs
// both events under mu) takes the locked path.
func (w *Work) completeInOrderTo(evs []*cuda.Event) []*cuda.Event {
	if !w.timing && w.state.CompareAndSwap(0, workDone) {
		return append(evs, w.end)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.pin() {
		return evs
	}
	w.noteDurationLocked()
	if w.end != nil {
		evs = append(evs, w.end)
		if st := w.startEv(); st != nil {
			evs = append(evs, st)
			w.ix.start = nil
		}
		w.end = nil
	}
	w.markDoneLocked()
	return evs
}

// noteDurationLocked keeps the op's device time, with EnableTiming.
func (w *Work) noteDurationLocked() {
	if st := w.startEv(); w.timing && st != nil {
		if d, err := cuda.ElapsedTime(st, w.end); err == nil {
			w.ix.dur = d
		}
	}
}

// completeLocked marks success, keeps the duration and recycles the
// events; w.mu is held and w pinned.
func (w *Work) completeLocked() {
	w.noteDurationLocked()
	w.recycleLocked()
	w.markDoneLocked()
}

// markDoneLocked records success, once the events are dealt with; w.mu is
// held and w pinned, so no one else changes its state.
func (w *Work) markDoneLocked() {
	w.state.Store(workDone)
	if f := w.futLocked(); f != nil {
		f.Complete(w.outputs(), nil)
	}
}

func (w *Work) recycleLocked() {
	if w.end == nil {
		return
	}
	w.c.putEvents(w.end, w.startEv())
	w.end = nil
	if w.ix != nil {
		w.ix.start = nil
	}
}

// failLocked records err if w has not finished; w.mu is held, and w may
// be pinned (by the caller). The swap decides against a lock-free
// completion racing with it: the first to finish w stands. A failed
// work's events stay with it (its kernel may still run).
func (w *Work) failLocked(err error) {
	s := w.state.Load()
	if s&workStatus != 0 || !w.state.CompareAndSwap(s, workFailed) {
		return
	}
	w.late().err = err
	if f := w.futLocked(); f != nil {
		f.Complete(nil, err)
	}
}

// fail records err if the work has not finished.
func (w *Work) fail(err error) {
	w.mu.Lock()
	w.failLocked(err)
	w.mu.Unlock()
}

// Wait implements backend.Work (PyTorch's wait()). In async mode it makes
// ctx's current stream wait on the end event, unless that stream is the
// one the op ran on (Options.AsyncOnCurrentStream, or the internal stream
// made current), and then releases the stash; the host does not block. In sync mode the kernel is already on the
// current stream and Wait does nothing. With BlockingWait, and for
// barriers, it also blocks the host until completion or the op's timeout.
func (w *Work) Wait(ctx context.Context) error {
	if w.async {
		// By identity: w.stream may have been destroyed by now (its
		// handle reads 0, as the default stream's does). On the op's own
		// stream (Options.AsyncOnCurrentStream, or the internal stream
		// made current) stream order does the wait, and the end event is
		// not touched, so no lock is taken.
		if cur := cuda.StreamFor(ctx, w.c.dev); cur != w.stream {
			w.mu.Lock()
			if w.pin() {
				err := cur.WaitEvent(w.end)
				w.unpin()
				if err != nil {
					w.mu.Unlock()
					return w.opErr(backend.ErrAborted, err)
				}
			}
			w.mu.Unlock()
		}
		w.releaseStash()
	}
	if w.barrier {
		// PyTorch's barrier: the current stream is synchronised, so the
		// host returns only after the barrier and the work before it.
		cur := cuda.StreamFor(ctx, w.c.dev)
		tctx, cancel := context.WithTimeout(context.Background(), w.timeout-(backend.Mono()-w.enq))
		defer cancel()
		if err := cur.SynchronizeContext(tctx); err != nil {
			return w.opErr(backend.ErrTimeout, err)
		}
	}
	if w.b.opts.BlockingWait {
		return w.blockingWait(ctx)
	}
	return w.Exception()
}

// blockingWait is Wait in blocking-wait mode (PyTorch's
// TORCH_NCCL_BLOCKING_WAIT): the host polls the end event and the
// communicator's asynchronous error every millisecond, and the watchdog
// unit checks the op's timeout; the error comes back here, in the caller.
// A timeout or an NCCL error aborts the group's communicators (in the
// background, bounded by AbortTimeout), so that later ops fail with
// ErrAborted keeping this error as the reason; the peers learn of it
// through the store. ctx ending returns its error and changes nothing.
func (w *Work) blockingWait(ctx context.Context) error {
	b := w.b
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	start := b.edge.now()
	for {
		if w.poll() {
			return w.Exception()
		}
		var acts []watch.Action[*Work]
		if !w.c.aborted.Load() {
			if st, err := w.c.asyncError(); err != nil || (st != 0 && st != ncclInProgress) {
				if err == nil {
					err = &Error{Call: "ncclCommGetAsyncError", Code: st, Detail: C.GoString(C.gn_last_error())}
				}
				kind := watch.Async
				if st == ncclRemoteError {
					kind = watch.AsyncRemote
				}
				b.mu.Lock()
				b.flushLocked(w.c)
				acts = b.wd.Report(watch.Failure[*Work]{Kind: kind, Work: w, Comm: w.c.key, Cause: err, Blocking: true})
				b.mu.Unlock()
			}
		}
		if acts == nil {
			b.mu.Lock()
			b.flushLocked(w.c)
			acts = b.wd.BlockingWait(w, b.edge.now())
			b.mu.Unlock()
		}
		if len(acts) > 0 {
			b.perform(context.Background(), acts, nil)
			return w.Exception()
		}
		select {
		case <-ctx.Done():
			return w.waitErr(ctx, start)
		case <-t.C:
		}
	}
}

// waitErr is the error of a host wait for w that ctx ended, after waiting
// since start: it says that the caller's context ended it, not the op's
// timeout (backend.WaitError).
func (w *Work) waitErr(ctx context.Context, start time.Time) error {
	now := w.b.edge.now()
	return &backend.WaitError{Op: w.op.String(), Seq: w.seq, Rank: w.b.rank, Backend: Name,
		Waited: now.Sub(start), Timeout: w.timeout, Elapsed: now.Sub(w.enqTime()), Err: ctx.Err()}
}

func (w *Work) opErr(kind error, err error) error {
	return &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: w.b.rank, Backend: Name, Kind: kind, Err: err, Timeout: w.timeout}
}

// BlockStream implements backend.Work: s waits on the op's end event.
func (w *Work) BlockStream(bs backend.Stream) error {
	s, ok := bs.(*cuda.Stream)
	if !ok {
		return w.opErr(backend.ErrInvalidArgument, fmt.Errorf("BlockStream needs a *cuda.Stream, got %T", bs))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.pin() {
		return w.errLocked()
	}
	err := s.WaitEvent(w.end)
	w.unpin()
	if err != nil {
		return w.opErr(backend.ErrAborted, err)
	}
	return nil
}

// WaitHost implements backend.Work: it polls the end event until the op
// completes, fails, or ctx is done (PyTorch's wait(timeout)). It never
// calls a blocking CUDA synchronisation, so an abort can always end it.
func (w *Work) WaitHost(ctx context.Context) error {
	var start time.Time
	for delay := time.Microsecond; ; delay = min(2*delay, time.Millisecond) {
		if w.poll() {
			return w.Exception()
		}
		if start.IsZero() {
			start = w.b.edge.now()
		}
		select {
		case <-ctx.Done():
			return w.waitErr(ctx, start)
		case <-time.After(delay):
		}
	}
}

// IsCompleted implements backend.Work: a non-blocking event query.
func (w *Work) IsCompleted() bool { return w.poll() }

// IsStarted implements backend.Work; it needs EnableTiming.
func (w *Work) IsStarted() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.timing {
		return false, backend.ErrNoTiming
	}
	if w.isFinished() || w.captured || w.startEv() == nil {
		return true, nil
	}
	return w.startEv().Query()
}

// Exception implements backend.Work.
func (w *Work) Exception() error {
	if !w.isFinished() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errLocked()
}

// Future implements backend.Work: it completes with the op's outputs once a
// query (the watchdog's, at the latest) sees the op complete.
func (w *Work) Future() *backend.Future {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.futLocked() == nil {
		f := backend.NewFuture()
		if w.captured {
			// Nothing on the host will see a replay end: the outputs are
			// the graph's, ordered by its stream.
			w.late().fut = f
			f.Complete(w.outputs(), nil)
		} else if w.pin() {
			// Pending: whoever completes w completes f, under mu (workFut
			// keeps the lock-free completer off).
			w.late().fut = f
			w.state.Store(w.state.Load() | workFut)
			w.unpin()
		} else {
			w.late().fut = f
			if err := w.errLocked(); err != nil {
				f.Complete(nil, err)
			} else {
				f.Complete(w.outputs(), nil)
			}
		}
	}
	return w.futLocked()
}

// SeqNum implements backend.Work.
func (w *Work) SeqNum() uint64 { return w.seq }

// Duration implements backend.Work: the device time between the start and
// end events, with EnableTiming.
func (w *Work) Duration() (time.Duration, error) {
	if !w.timing {
		return 0, backend.ErrNoTiming
	}
	if w.captured {
		return 0, fmt.Errorf("nccl: %s seq %d was captured into a CUDA graph: it has no duration of its own", w.op, w.seq)
	}
	if !w.poll() {
		return 0, fmt.Errorf("nccl: duration requested before the op completed")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	if w.ix != nil {
		d = w.ix.dur
	}
	return d, w.errLocked()
}

// Abort implements backend.Work: it fails the op with ErrAborted and aborts
// its communicator, which is what unblocks a kernel waiting for peers.
func (w *Work) Abort(reason error) {
	if w.poll() {
		return
	}
	w.fail(w.opErr(backend.ErrAborted, reason))
	if !w.c.aborted.Swap(true) {
		abortComm(w.c)
	}
}

// Device returns the CUDA device the op ran on.
func (w *Work) Device() int { return w.c.dev.Ordinal() }

// Stream returns the stream the op's kernel was queued on: the internal
// stream in async mode, the current stream in sync mode and in async mode
// with Options.AsyncOnCurrentStream.
func (w *Work) Stream() *cuda.Stream { return w.stream }
