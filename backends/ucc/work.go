package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// work is the Work of one op: the UCC requests it posted (several for a
// list of tensors or a coalesced form, one Work for them all), what to do
// with the results, and the pins of the host buffers UCC points into.
//
// A work completes once (HostWork): when UCC has finished every request
// (after runs first), or earlier when it fails (timeout, a peer's abort,
// Abort). A work failed early stays in Backend.pending while a request is
// still posted: the progress goroutine finalises the requests if they ever
// finish, and only then unpins the buffers.
type work struct {
	*backend.HostWork
	b       *Backend
	op      backend.Op
	seq     uint64
	timeout time.Duration
	enq     time.Time

	reqs    []C.uintptr_t // 0 once finalised
	err     error         // the first request that failed in UCC
	cerr    C.int         // its status, as gu_reap and gu_drive record it
	deps    []*work       // a barrier's earlier works
	after   func()        // on success, before completion: copies, AVG's division
	outputs []*tensor.Tensor
	pin     runtime.Pinner
	keep    [][]byte // scratch buffers UCC points into
}

// testLocked finalises the requests UCC has finished and reports whether
// the work has left UCC (and its barrier dependencies are complete); it
// then completes the work, unless it failed before. b.mu is held.
func (w *work) testLocked() bool {
	if w.reap() {
		return false
	}
	for _, d := range w.deps {
		if !d.IsCompleted() {
			return false
		}
	}
	w.deps = nil
	w.pin.Unpin()
	w.keep = nil
	if !w.IsCompleted() {
		if w.err != nil {
			w.Complete(nil, &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: w.b.cfg.Rank, Backend: Name, Kind: backend.ErrRemote, Err: w.err,
				Detail: "UCC failed the collective"})
		} else {
			if w.after != nil {
				w.after()
			}
			w.Complete(w.outputs, nil)
		}
	}
	return true
}

// reap finalises the requests UCC has finished (one cgo crossing for them
// all) and reports whether any is still in progress. b.mu is held.
func (w *work) reap() (busy bool) {
	if len(w.reqs) == 0 {
		return false
	}
	busy = C.gu_reap(&w.reqs[0], C.int(len(w.reqs)), &w.cerr) > 0
	w.noteErr()
	return busy
}

// noteErr turns the first failed status C recorded into w.err.
func (w *work) noteErr() {
	if w.cerr != 0 && w.err == nil {
		w.err = &Error{Call: "ucc_collective_test", Status: int(w.cerr)}
	}
}

// fail completes the work with err, if it has not completed; its requests
// stay posted until UCC finishes them.
func (w *work) fail(err error) { w.Complete(nil, err) }

// WaitHost implements backend.Work. When ctx ends first, the error (a
// *backend.WaitError) names the op and says that the caller's deadline
// fired, and whether the op's own timeout had passed.
func (w *work) WaitHost(ctx context.Context) error {
	start := time.Now()
	if !w.IsCompleted() {
		w.b.drive(ctx, w)
	}
	err := w.HostWork.WaitHost(ctx)
	var we *backend.WaitError
	if errors.As(err, &we) && we.Op == "" {
		we.Op, we.Rank, we.Backend, we.Timeout = w.op.String(), w.b.cfg.Rank, Name, w.timeout
		we.Waited, we.Elapsed = time.Since(start), time.Since(w.enq)
	}
	return err
}

// Wait implements backend.Work: it progresses UCC itself for a while
// (drive.go), then blocks until the op completes.
func (w *work) Wait(ctx context.Context) error {
	if !w.IsCompleted() {
		w.b.drive(ctx, w)
	}
	return w.HostWork.Wait(ctx)
}

// BlockStream implements backend.Work: with no stream to order, it blocks
// the host.
func (w *work) BlockStream(backend.Stream) error { return w.Wait(context.Background()) }
