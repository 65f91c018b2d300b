package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// Backend is a host backend that also takes CUDA tensors by staging them
// (see the package documentation). It implements backend.Backend.
type Backend struct {
	inner   backend.Backend
	engines Engines

	// idle is stopped == nil && len(queue) == 0 && !running, stored under
	// mu whenever one of them changes (setIdleLocked), for hostNow's look
	// without the lock.
	idle atomic.Bool

	mu       sync.Mutex
	cond     sync.Cond
	queue    []*entry // ops waiting to be issued to the inner backend, in order
	running  bool     // the issuer goroutine is running
	staged   []*work  // staged works not yet complete, for barriers and Close
	used     map[int]Engine
	stopped  error              // ErrClosed or the abort error
	stopCtx  context.Context    // ends when Abort is called
	stopFunc context.CancelFunc // ends stopCtx
}

var _ backend.Backend = (*Backend)(nil)

// Wrap returns a Backend that serves inner's CPU tensors through inner and
// CUDA tensors by staging them on the engines.
func Wrap(inner backend.Backend, engines Engines) *Backend {
	b := &Backend{inner: inner, engines: engines, used: map[int]Engine{}}
	b.cond.L = &b.mu
	b.idle.Store(true)
	b.stopCtx, b.stopFunc = context.WithCancel(context.Background())
	return b
}

// Unwrap returns the host backend.
func (b *Backend) Unwrap() backend.Backend { return b.inner }

// Name implements backend.Core: the host backend's name.
func (b *Backend) Name() string { return b.inner.Name() }

// Capabilities implements backend.Core: the host backend's, with CUDA
// tensors and stream semantics (Wait orders the current stream). Stream
// backends have no recv_anysource on CUDA tensors, nor graph capture or
// coalescing blocks.
func (b *Backend) Capabilities() backend.Capabilities {
	c := b.inner.Capabilities()
	if !slices.Contains(c.Devices, tensor.CUDA) {
		c.Devices = append(slices.Clone(c.Devices), tensor.CUDA)
	}
	c.StreamSemantics = true
	c.Coalescing, c.GraphCapture = false, false
	return c
}

// Rank implements backend.Core.
func (b *Backend) Rank() int { return b.inner.Rank() }

// Size implements backend.Core.
func (b *Backend) Size() int { return b.inner.Size() }

// Heartbeat forwards the host backend's heartbeat, if it has one.
func (b *Backend) Heartbeat() uint64 {
	if h, ok := b.inner.(backend.Heartbeater); ok {
		return h.Heartbeat()
	}
	return 0
}

// Stream returns the internal stream of CUDA device dev (a *cuda.Stream),
// for tests that hold it with a gate.
func (b *Backend) Stream(dev int) (backend.Stream, error) {
	e, err := b.engine(dev)
	if err != nil {
		return nil, err
	}
	return e.Stream(), nil
}

func (b *Backend) engine(dev int) (Engine, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.used[dev]; ok {
		return e, nil
	}
	e, err := b.engines(dev)
	if err != nil {
		return nil, err
	}
	b.used[dev] = e
	return e, nil
}

// Close implements backend.Core: it waits (bounded by ctx) until every op
// has been issued to the host backend and every staged op has completed,
// closes the host backend, then the engines.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.stopped == nil {
		b.stopped = backend.ErrClosed
		b.setIdleLocked()
	}
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	for (len(b.queue) > 0 || b.running) && ctx.Err() == nil {
		b.cond.Wait()
	}
	works := slices.Clone(b.staged)
	b.mu.Unlock()
	stop()
	var errs []error
	for _, w := range works {
		if err := w.WaitHost(ctx); err != nil && ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("stage: close: %w", ctx.Err()))
			break
		}
	}
	errs = append(errs, b.inner.Close(ctx))
	if len(errs) == 1 && errs[0] == nil {
		errs = append(errs, b.closeEngines())
	}
	return errors.Join(errs...)
}

// closeEngines releases the engines once no staged op is left: an engine
// whose op is still held keeps its memory (freeing pinned memory while a
// stream is held could hang the device).
func (b *Backend) closeEngines() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.liveLocked()) > 0 {
		return nil
	}
	var errs []error
	for dev, e := range b.used {
		errs = append(errs, e.Close())
		delete(b.used, dev)
	}
	return errors.Join(errs...)
}

// Abort implements backend.Core: the staged works fail with ErrAborted at
// once, the ops not yet issued fail as the host backend fails them, and
// the host backend is aborted.
func (b *Backend) Abort(ctx context.Context, reason error) error {
	if reason == nil {
		reason = errors.New("abort requested")
	}
	b.mu.Lock()
	if b.stopped == nil || errors.Is(b.stopped, backend.ErrClosed) {
		b.stopped = &backend.OpError{Op: "abort", Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: backend.ErrAborted, Err: reason}
		b.setIdleLocked()
	}
	works := b.liveLocked()
	b.mu.Unlock()
	b.stopFunc()
	for _, w := range works {
		w.Abort(reason)
	}
	return b.inner.Abort(ctx, reason)
}

// liveLocked drops the completed staged works and returns the rest.
func (b *Backend) liveLocked() []*work {
	b.staged = slices.DeleteFunc(b.staged, func(w *work) bool { return w.IsCompleted() })
	return slices.Clone(b.staged)
}

// call is an op of the inner backend with its tensor arguments replaced
// through sub (the identity for an op issued directly).
type call func(ctx context.Context, m backend.Meta, sub func(*tensor.Tensor) *tensor.Tensor) (backend.Work, error)

// entry is an op waiting in the queue to be issued to the inner backend.
type entry struct {
	ctx    context.Context
	m      backend.Meta
	issued time.Time
	call   call
	w      *work
}

// do issues one op. ts are all its tensors, back says which of them the op
// writes. An op on host tensors goes to the inner backend at once unless
// ops are queued before it; an op on CUDA tensors is staged and queued.
func (b *Backend) do(ctx context.Context, m backend.Meta, ts []*tensor.Tensor, back []bool, c call) (backend.Work, error) {
	dev := -1
	for _, t := range ts {
		if t != nil && t.Device().Type == tensor.CUDA {
			dev = t.Device().Index
			if !t.IsContiguous() {
				return nil, b.invalid(m, "Tensors must be contiguous")
			}
		}
	}
	b.mu.Lock()
	if err := b.stopped; err != nil {
		b.mu.Unlock()
		if dev < 0 {
			return b.direct(ctx, m, c) // the host backend reports it
		}
		return nil, &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: kindOf(err), Err: err}
	}
	if dev < 0 && b.idle.Load() { // hostNow's look: nothing queued or being issued
		b.mu.Unlock()
		return b.direct(ctx, m, c)
	}
	b.mu.Unlock()
	w := &work{b: b, m: m, fut: backend.NewFuture(), ready: make(chan struct{})}
	if dev >= 0 {
		e, err := b.engine(dev)
		if err != nil {
			return nil, &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: backend.ErrUnavailable, Err: err}
		}
		// Each device tensor once (a tensor passed twice is staged once,
		// and copied back if the op writes it in either place).
		dts := make([]*tensor.Tensor, 0, len(ts))
		dback := make([]bool, 0, len(ts))
		for i, t := range ts {
			if t == nil || t.Device().Type != tensor.CUDA {
				continue
			}
			if j := slices.Index(dts, t); j >= 0 {
				dback[j] = dback[j] || back[i]
				continue
			}
			dts, dback = append(dts, t), append(dback, back[i])
		}
		st, err := e.Stage(ctx, dts, dback)
		if err != nil {
			return nil, &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: backend.ErrUnavailable, Err: err,
				Detail: "staging the CUDA tensors through host memory"}
		}
		w.st, w.host = st, map[*tensor.Tensor]*tensor.Tensor{}
		for i, h := range st.Host() {
			w.host[dts[i]] = h
		}
		for i, t := range dts {
			if dback[i] {
				w.outputs = append(w.outputs, t)
			}
		}
	}
	b.mu.Lock()
	b.queue = append(b.queue, &entry{ctx: context.WithoutCancel(ctx), m: m, issued: time.Now(), call: c, w: w})
	if w.st != nil {
		b.staged = append(b.staged, w)
	}
	if !b.running {
		b.running = true
		go b.issuer()
	}
	b.setIdleLocked()
	b.mu.Unlock()
	return w, nil
}

// setIdleLocked stores idle after stopped, queue or running changed; b.mu
// is held.
func (b *Backend) setIdleLocked() {
	b.idle.Store(b.stopped == nil && len(b.queue) == 0 && !b.running)
}

// direct issues an op to the inner backend on the caller's goroutine.
//
// Why no lock around the call (nor around the issuer's): the inner
// backend is safe for concurrent calls, as it is unwrapped on a host
// without CUDA. What the wrapper keeps is the order of one goroutine's
// ops: a host op goes direct only while nothing is queued or being issued
// (idle), so it never overtakes a staged op issued before it. Ops issued
// at once from two goroutines have no order to keep, wrapped or not (a
// lock around the call did not give them one either: the issuer could
// take it between a caller's look at the queue and its call).
func (b *Backend) direct(ctx context.Context, m backend.Meta, c call) (backend.Work, error) {
	return c(ctx, m, func(t *tensor.Tensor) *tensor.Tensor { return t })
}

// issuer issues the queued ops in order, each staged one once its copies
// have landed, and exits when the queue is empty.
func (b *Backend) issuer() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.setIdleLocked()
			b.cond.Broadcast()
			b.mu.Unlock()
			return
		}
		e := b.queue[0]
		b.mu.Unlock()
		b.issue(e)
		b.mu.Lock()
		b.queue[0] = nil
		b.queue = b.queue[1:]
		b.mu.Unlock()
	}
}

// issue waits for e's copies, bounded by the op's deadline and Abort, and
// issues it. The inner op gets what is left of the timeout (at least a
// nanosecond): past the deadline it fails at once with ErrTimeout, found
// and reported by the host backend as its own timeouts are, and it is
// issued all the same so that every rank's host backend sees one sequence.
func (b *Backend) issue(e *entry) {
	w := e.w
	m := e.m
	var copyErr error
	if w.st != nil {
		wctx, cancel := b.stopCtx, context.CancelFunc(func() {})
		if m.Timeout > 0 {
			wctx, cancel = context.WithDeadline(b.stopCtx, e.issued.Add(m.Timeout))
		}
		copyErr = w.st.WaitCopied(wctx)
		cancel()
		if copyErr != nil && wctx.Err() != nil {
			copyErr = nil // the host op reports the timeout or the abort
		}
	}
	if m.Timeout > 0 {
		m.Timeout = max(m.Timeout-time.Since(e.issued), time.Nanosecond)
	}
	sub := func(t *tensor.Tensor) *tensor.Tensor {
		if h, ok := w.host[t]; ok {
			return h
		}
		return t
	}
	iw, err := e.call(e.ctx, m, sub)
	w.setInner(iw, err)
	if w.st != nil {
		go w.finish(copyErr)
	} else {
		go w.forward()
	}
}

func (b *Backend) invalid(m backend.Meta, format string, args ...any) error {
	return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.inner.Rank(), Backend: b.inner.Name(), Kind: backend.ErrInvalidArgument, Detail: fmt.Sprintf(format, args...)}
}

func kindOf(err error) error {
	if errors.Is(err, backend.ErrAborted) {
		return backend.ErrAborted
	}
	return backend.ErrClosed
}
