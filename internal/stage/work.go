package stage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// work is the Work of an op that went through the queue: a staged op on
// CUDA tensors (st set), or a host op queued behind one. It completes
// through fut: a staged op once its end event has completed (or at once
// when it fails), a queued host op when the inner work does.
type work struct {
	b       *Backend
	m       backend.Meta
	fut     *backend.Future
	st      Staged
	host    map[*tensor.Tensor]*tensor.Tensor // device tensor -> its host tensor
	outputs []*tensor.Tensor                  // the device tensors the op writes

	ready   chan struct{} // closed once the op has been issued to the inner backend
	inner   backend.Work
	ierr    error
	aborted atomic.Pointer[error] // Abort's reason, before the op was issued
	once    sync.Once
}

func (w *work) setInner(iw backend.Work, err error) {
	w.inner, w.ierr = iw, err
	close(w.ready)
	if r := w.aborted.Load(); r != nil && iw != nil {
		iw.Abort(*r)
	}
}

func (w *work) issued() bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// forward completes a queued host op's future with the inner work's.
func (w *work) forward() {
	if w.ierr != nil {
		w.fut.Complete(nil, w.ierr)
		return
	}
	v, err := w.inner.Future().Wait(context.Background())
	w.fut.Complete(v, err)
}

// finish runs a staged op to its end: the host op, then the hold's
// release, the copies back, the end event; then the stash goes.
func (w *work) finish(copyErr error) {
	err := w.ierr
	if err == nil {
		err = w.inner.WaitHost(context.Background())
	}
	if err == nil && copyErr != nil {
		err = &backend.OpError{Op: w.m.Op.String(), Seq: w.m.Seq, Rank: w.b.inner.Rank(), Backend: w.b.inner.Name(),
			Kind: backend.ErrUnavailable, Err: copyErr, Detail: "copying the CUDA tensors to host memory"}
	}
	w.st.Release()
	if err != nil {
		// The outputs are unspecified, as after any failed op; the caller
		// learns of it now, not when the device gets to the end event.
		w.fut.Complete(nil, err)
	}
	derr := w.st.WaitDone(context.Background())
	// Freed before the completion: once a WaitHost returns, the op holds
	// nothing (the device is done with the stash by now).
	w.st.Free()
	w.fut.Complete(w.outputs, derr)
	w.b.mu.Lock()
	w.b.liveLocked()
	w.b.mu.Unlock()
}

// Wait implements backend.Work. A staged op makes ctx's current stream
// wait on its end event and returns without blocking the host (nccl's
// stream semantics); an op that has failed already returns its error. A
// queued host op waits as the host backend's Wait does, once issued.
func (w *work) Wait(ctx context.Context) error {
	if w.st == nil {
		<-w.ready
		if w.ierr != nil {
			return w.ierr
		}
		return w.inner.Wait(ctx)
	}
	if err := w.Exception(); err != nil {
		return err
	}
	return w.st.OrderCurrent(ctx)
}

// BlockStream implements backend.Work: s waits for a staged op's end
// event; a queued host op blocks the host, as host works do.
func (w *work) BlockStream(s backend.Stream) error {
	if w.st == nil {
		<-w.ready
		if w.ierr != nil {
			return w.ierr
		}
		return w.inner.BlockStream(s)
	}
	return w.st.OrderStream(s)
}

// WaitHost implements backend.Work: it blocks until the op has completed
// (a staged op: until its end event has), or ctx ends first, which is a
// *backend.WaitError.
func (w *work) WaitHost(ctx context.Context) error {
	start := time.Now()
	if w.st == nil {
		select {
		case <-w.ready:
		case <-ctx.Done():
			return w.waitError(ctx, start)
		}
		if w.ierr != nil {
			return w.ierr
		}
		return w.inner.WaitHost(ctx)
	}
	select {
	case <-w.fut.Done():
		_, err := w.fut.Value()
		return err
	case <-ctx.Done():
		return w.waitError(ctx, start)
	}
}

func (w *work) waitError(ctx context.Context, start time.Time) error {
	return &backend.WaitError{Op: w.m.Op.String(), Seq: w.m.Seq, Rank: w.b.inner.Rank(), Backend: w.b.inner.Name(),
		Waited: time.Since(start), Timeout: w.m.Timeout, Err: ctx.Err()}
}

// IsCompleted implements backend.Work. A queued host op is complete when
// its inner work is (its future follows a moment later).
func (w *work) IsCompleted() bool {
	if w.st == nil && w.issued() {
		return w.ierr != nil || w.inner.IsCompleted()
	}
	return w.fut.IsDone()
}

// IsStarted implements backend.Work: an op has started once it has been
// issued to the host backend (a staged one: once its inputs are on the
// host).
func (w *work) IsStarted() (bool, error) {
	if !w.issued() {
		return false, nil
	}
	if w.inner == nil {
		return true, nil
	}
	return w.inner.IsStarted()
}

// Exception implements backend.Work.
func (w *work) Exception() error {
	if w.st == nil && w.issued() {
		if w.ierr != nil {
			return w.ierr
		}
		return w.inner.Exception()
	}
	if !w.fut.IsDone() {
		return nil
	}
	_, err := w.fut.Value()
	return err
}

// Future implements backend.Work: it completes with the op's (device)
// outputs.
func (w *work) Future() *backend.Future { return w.fut }

// SeqNum implements backend.Work.
func (w *work) SeqNum() uint64 { return w.m.Seq }

// Duration implements backend.Work: the host op's duration.
func (w *work) Duration() (time.Duration, error) {
	if !w.issued() || w.inner == nil {
		return 0, errors.New("duration requested before the op completed")
	}
	if !w.fut.IsDone() {
		return 0, errors.New("duration requested before the op completed")
	}
	return w.inner.Duration()
}

// Abort implements backend.Work: the op fails with ErrAborted now; the
// host op is aborted (once issued: an op not yet issued still is, so that
// the ranks' sequences stay the same, and aborted at once).
func (w *work) Abort(reason error) {
	if w.fut.IsDone() {
		return
	}
	w.aborted.CompareAndSwap(nil, &reason)
	if w.issued() && w.inner != nil {
		w.inner.Abort(reason)
	}
	w.fut.Complete(nil, &backend.OpError{Op: w.m.Op.String(), Seq: w.m.Seq, Rank: w.b.inner.Rank(), Backend: w.b.inner.Name(),
		Kind: backend.ErrAborted, Err: reason})
}

// SourceRank implements backend.SourceRanker for a recv_anysource queued
// behind a staged op.
func (w *work) SourceRank() (int, error) {
	<-w.ready
	if sr, ok := w.inner.(backend.SourceRanker); ok {
		return sr.SourceRank()
	}
	return -1, fmt.Errorf("stage: %s has no source rank", w.m.Op)
}

// barrierWork is a barrier's Work: the host barrier, which follows every
// earlier op of the host backend, and the staged works before it, which
// complete only once their results are back on the device.
type barrierWork struct {
	backend.Work
	m    backend.Meta
	deps []*work
}

func (w *barrierWork) depsDone() bool {
	for _, d := range w.deps {
		if !d.IsCompleted() {
			return false
		}
	}
	return true
}

// Wait implements backend.Work: it blocks the host until the earlier
// staged ops and the barrier have completed.
func (w *barrierWork) Wait(ctx context.Context) error {
	for _, d := range w.deps {
		_ = d.WaitHost(context.Background())
	}
	return w.Work.Wait(ctx)
}

// BlockStream implements backend.Work: a host barrier blocks the host.
func (w *barrierWork) BlockStream(backend.Stream) error { return w.Wait(context.Background()) }

// WaitHost implements backend.Work.
func (w *barrierWork) WaitHost(ctx context.Context) error {
	for _, d := range w.deps {
		var we *backend.WaitError
		if err := d.WaitHost(ctx); errors.As(err, &we) {
			we.Op, we.Seq = w.m.Op.String(), w.m.Seq
			return err
		}
	}
	return w.Work.WaitHost(ctx)
}

// IsCompleted implements backend.Work.
func (w *barrierWork) IsCompleted() bool { return w.depsDone() && w.Work.IsCompleted() }
