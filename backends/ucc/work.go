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

// work is the Work of one op: the UCC requests it posted (several for a
// list of tensors or a coalesced form, one Work for them all), what to do
// with the results, and the pins of the host buffers UCC points into.
//
// A work completes once: when UCC has finished every request (after runs
// first), or earlier when it fails (timeout, a peer's abort, Abort). A
// work failed early stays in Backend.pending while a request is still
// posted: the progress goroutine finalises the requests if they ever
// finish, and only then unpins the buffers.
//
// Why not backend.HostWork: an op of a few bytes costs the raw libucc loop
// under a microsecond, and a HostWork is three allocations (itself, its
// Future, the Future's channel) and a clock read more than the work
// itself. A work carries its completion in its own fields (done, res,
// err), makes the channel only when a waiter has to block and the Future
// only when asked for, and embeds its plan, so that an allreduce of one
// tensor is one allocation.
type work struct {
	plan
	seq     uint64
	timeout time.Duration
	enq     time.Duration // issue (Backend.now); the start of Duration
	watched bool          // in b.wd (the progress goroutine enqueues works that outlive a tick); b.mu

	reqs  []C.uintptr_t // 0 once finalised
	reqv  [1]C.uintptr_t
	live  int     // requests not yet finalised, as far as Go knows; b.mu
	err   error   // the first request that failed in UCC
	cerr  C.int   // its status, as gu_reap and gu_drive record it
	at    C.int   // gu_coll_start's report: which collective failed,
	post  C.int   // and whether in its post
	deps  []*work // a barrier's earlier works
	fpw   fpWork  // its part in the fingerprint check (fingerprint.go); b.mu
	pin   runtime.Pinner
	pinv  [1][]byte         // plan.pins' first element: no allocation for one buffer
	descv [1]C.gu_desc      // plan.descs', likewise
	one   [1]*tensor.Tensor // plan.outputs of an op of one tensor

	done atomic.Bool // set once, after res and err (and end) are written
	mu   sync.Mutex  // guards the completion below, ch and fut
	res  []*tensor.Tensor
	rerr error
	end  time.Duration   // completion (Backend.now)
	ch   chan struct{}   // closed at completion; made by a waiter that blocks
	fut  *backend.Future // made by Future
}

var _ backend.Work = (*work)(nil)

// newWork makes the work of op m and its plan (outputs: what the Future
// gives). enq is taken by submit.
func (b *Backend) newWork(op backend.Op, m backend.Meta, outputs []*tensor.Tensor) *work {
	w := &work{seq: m.Seq, timeout: m.Timeout}
	w.plan = plan{b: b, w: w, op: op, m: m, outputs: outputs, descs: w.descv[:0], pins: w.pinv[:0]}
	return w
}

// complete finishes the work with (res, err) unless it has finished; it
// reports whether this call finished it.
func (w *work) complete(res []*tensor.Tensor, err error) bool {
	w.mu.Lock()
	if w.done.Load() {
		w.mu.Unlock()
		return false
	}
	w.res, w.rerr, w.end = res, err, w.b.now()
	w.done.Store(true)
	ch, fut := w.ch, w.fut
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if fut != nil {
		fut.Complete(res, err)
	}
	return true
}

// doneCh is the channel closed at completion, made on first use.
func (w *work) doneCh() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
		if w.done.Load() {
			close(w.ch)
		}
	}
	return w.ch
}

// testLocked finalises the requests UCC has finished and reports whether
// the work has left UCC (and its barrier dependencies are complete); it
// then completes the work, unless it failed before. b.mu is held.
func (w *work) testLocked() bool {
	if w.fpw.held || w.reap() {
		return false
	}
	for _, d := range w.deps {
		if !d.IsCompleted() {
			return false
		}
	}
	w.deps = nil
	w.pin.Unpin()
	w.pins, w.arrs = nil, nil
	if !w.IsCompleted() {
		if w.err != nil {
			w.complete(nil, &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: w.b.cfg.Rank, Backend: Name, Kind: backend.ErrRemote, Err: w.err,
				Detail: "UCC failed the collective"})
		} else {
			if w.after != nil {
				w.after()
			}
			w.complete(w.outputs, nil)
		}
	}
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

// fail completes the work with err, if it has not completed; its requests
// stay posted until UCC finishes them.
func (w *work) fail(err error) { w.complete(nil, err) }

// WaitHost implements backend.Work. When ctx ends first, the error (a
// *backend.WaitError) names the op and says that the caller's deadline
// fired, and whether the op's own timeout had passed.
func (w *work) WaitHost(ctx context.Context) error {
	var start time.Time
	if !w.IsCompleted() {
		// Its clock read, not one here: most waits need none.
		start = w.b.drive(ctx, w)
	}
	if w.IsCompleted() {
		return w.rerr
	}
	if start.IsZero() {
		start = time.Now()
	}
	select {
	case <-w.doneCh():
		return w.rerr
	case <-ctx.Done():
		return &backend.WaitError{Op: w.op.String(), Seq: w.seq, Rank: w.b.cfg.Rank, Backend: Name, Timeout: w.timeout,
			Waited: time.Since(start), Elapsed: w.b.now() - w.enq, Err: ctx.Err()}
	}
}

// Wait implements backend.Work: it progresses UCC itself for a while
// (drive.go), then blocks until the op completes.
func (w *work) Wait(ctx context.Context) error {
	if !w.IsCompleted() {
		w.b.drive(ctx, w)
	}
	if !w.IsCompleted() {
		<-w.doneCh()
	}
	return w.rerr
}

// BlockStream implements backend.Work: with no stream to order, it blocks
// the host.
func (w *work) BlockStream(backend.Stream) error { return w.Wait(context.Background()) }

// IsCompleted implements backend.Work.
func (w *work) IsCompleted() bool { return w.done.Load() }

// IsStarted implements backend.Work: a work exists once posted.
func (w *work) IsStarted() (bool, error) { return true, nil }

// Exception implements backend.Work.
func (w *work) Exception() error {
	if !w.done.Load() {
		return nil
	}
	return w.rerr
}

// Future implements backend.Work; the Future is made on first use.
func (w *work) Future() *backend.Future {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fut == nil {
		w.fut = backend.NewFuture()
		if w.done.Load() {
			w.fut.Complete(w.res, w.rerr)
		}
	}
	return w.fut
}

// SeqNum implements backend.Work.
func (w *work) SeqNum() uint64 { return w.seq }

// Duration implements backend.Work: from issue to completion.
func (w *work) Duration() (time.Duration, error) {
	if !w.done.Load() {
		return 0, errors.New("duration requested before the op completed")
	}
	return w.end - w.enq, nil
}

// Abort implements backend.Work: it fails this work with ErrAborted (UCC
// cannot cancel the requests, which stay posted, as after a timeout).
func (w *work) Abort(reason error) {
	if w.done.Load() {
		return
	}
	w.complete(nil, fmt.Errorf("%w: %w", backend.ErrAborted, reason))
}
