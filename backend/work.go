package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/tensor"
)

// Work is the handle of an issued op. It is never nil when the op's error is
// nil. Its methods are safe for concurrent use.
//
// The waits differ on purpose, to make explicit what PyTorch's single wait()
// leaves implicit:
//
//   - Wait is PyTorch's wait(). A stream backend makes ctx's current stream
//     wait on the op's end event, releases the stashed tensors and returns
//     without blocking the host. A host backend blocks until completion. A
//     deadline on ctx never changes what Wait does; the op's own timeout
//     bounds it.
//   - BlockStream only orders stream s after the op.
//   - WaitHost blocks the goroutine until the op has finished on the device,
//     or ctx is done (PyTorch's wait(timeout)).
type Work interface {
	// Wait is PyTorch's Work.wait(); see the type's documentation.
	Wait(ctx context.Context) error
	// BlockStream makes stream s wait for the op, without blocking the host.
	// Host backends block until completion instead, since there is no stream
	// to order.
	// A stream backend accepts only its own stream type (*cuda.Stream for
	// nccl) and fails with ErrInvalidArgument for any other.
	BlockStream(s Stream) error
	// WaitHost blocks until the op has completed or failed, or ctx is done.
	WaitHost(ctx context.Context) error
	// IsCompleted reports, without blocking, whether the op has finished
	// (successfully or not).
	IsCompleted() bool
	// IsStarted reports whether the op has started running. It needs timing
	// to be on for stream backends, and returns an error otherwise.
	IsStarted() (bool, error)
	// Exception returns the op's error once it has failed, else nil.
	Exception() error
	// Future completes with the op's outputs when the op completes.
	Future() *Future
	// SeqNum is the sequence number the dispatcher assigned (collective or
	// p2p counter, by the op's kind).
	SeqNum() uint64
	// Duration is the op's device or worker time. It returns an error when
	// timing was off when the op was issued, or the op has not completed.
	Duration() (time.Duration, error)
	// Abort fails the op with ErrAborted (wrapping reason) if it has not
	// completed, and aborts what the backend must to unblock it.
	Abort(reason error)
}

// Stream is a device stream that Work.BlockStream orders; *cuda.Stream
// implements it. The contract names no concrete stream type so that it,
// and everything built only on it, stays free of cgo.
type Stream interface {
	// Device is the ordinal of the device the stream belongs to.
	Device() int
	// Handle is the native stream handle (a CUstream for CUDA).
	Handle() uintptr
}

// ErrNoTiming is returned by Duration and IsStarted when timing was off.
var ErrNoTiming = errors.New("timing was not enabled when the op was issued")

// Future is a value that completes once: a list of tensors or an error.
//
// Its channel is made only when something asks for it (Done, a wait that
// blocks): a host op's caller usually runs the op itself or sees it done
// when it looks, and a channel per op was one of the allocations of the
// 8 B allreduce (docs/perf.md, issue 17). The zero Future is incomplete
// and ready to use.
type Future struct {
	state atomic.Bool // set, under mu, once val and err are
	mu    sync.Mutex
	done  chan struct{} // made by the first Done; closed at completion
	val   []*tensor.Tensor
	err   error
}

// NewFuture returns an incomplete Future.
func NewFuture() *Future { return &Future{} }

// Complete sets the result. Only the first call has an effect; it reports
// whether this call completed the future. A racing second call returns
// once the first has completed it.
func (f *Future) Complete(val []*tensor.Tensor, err error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state.Load() {
		return false
	}
	f.val, f.err = val, err
	f.state.Store(true)
	if f.done != nil {
		close(f.done)
	}
	return true
}

// Done is closed when the future completes.
func (f *Future) Done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
		if f.state.Load() {
			close(f.done)
		}
	}
	return f.done
}

// IsDone reports whether the future has completed.
func (f *Future) IsDone() bool { return f.state.Load() }

// Wait blocks until the future completes or ctx is done.
func (f *Future) Wait(ctx context.Context) ([]*tensor.Tensor, error) {
	if f.IsDone() {
		return f.val, f.err
	}
	select {
	case <-f.Done():
		return f.val, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("future: %w", ctx.Err())
	}
}

// Value returns the result of a completed future, or an error saying it has
// not completed.
func (f *Future) Value() ([]*tensor.Tensor, error) {
	if !f.IsDone() {
		return nil, errors.New("future: value requested before completion")
	}
	return f.val, f.err
}

// Then returns a future completed with fn's result once f completes. fn runs
// on its own goroutine and sees f's value and error.
func (f *Future) Then(fn func([]*tensor.Tensor, error) ([]*tensor.Tensor, error)) *Future {
	next := NewFuture()
	done := f.Done()
	go func() {
		<-done
		next.Complete(fn(f.val, f.err))
	}()
	return next
}

// monoEpoch is the origin of Mono.
var monoEpoch = time.Now()

// Mono is the monotonic clock that HostWork.CompletedAt and the
// dispatcher's metrics stamp times on: the time since the process loaded
// the package. It reads the clock once (time.Since of a time with a
// monotonic reading), where time.Now reads the wall clock too, at about
// three times the cost on a virtual machine.
func Mono() time.Duration { return time.Since(monoEpoch) }

// MonoOf is t on the Mono clock, for a t from time.Now (which carries a
// monotonic reading): no clock is read.
func MonoOf(t time.Time) time.Duration { return t.Sub(monoEpoch) }

// MonoTime is the time.Time of Mono reading d, with a monotonic reading:
// a deadline computed from Mono with no read of the wall clock.
func MonoTime(d time.Duration) time.Time { return monoEpoch.Add(d) }

// HostWork is a Work completed by a host goroutine: the work of host
// backends, and a building block for others. Its Wait blocks the host.
//
// Its future lives in it, and its times are Mono readings (one clock read
// each, where time.Now reads two clocks), so that a backend that embeds
// it in its own per-op record (Init) pays no allocation and one cheap
// clock read for it per op (the completion's), two when timed (the
// start's too).
type HostWork struct {
	fut     Future
	seq     uint64
	timing  bool
	started atomic.Bool
	start   atomic.Int64 // Mono ns, set by MarkStarted
	endMono atomic.Int64 // Mono ns, set by Complete (CompletedAt)
	onAbort AbortHook
}

// AbortHook is what an incomplete HostWork's Abort calls first, to abort
// what the backend must to unblock the op.
type AbortHook interface {
	// OnAbort is called once, with the op's error, before the work fails.
	OnAbort(err error)
}

// abortFunc is the AbortHook of NewHostWork's onAbort.
type abortFunc func(error)

func (f abortFunc) OnAbort(err error) { f(err) }

// NewHostWork returns an incomplete HostWork. With timing, Duration reports
// the time from MarkStarted to Complete. onAbort, if not nil, runs once when
// Abort is called on an incomplete work.
func NewHostWork(seq uint64, timing bool, onAbort func(error)) *HostWork {
	w := &HostWork{}
	var h AbortHook
	if onAbort != nil {
		h = abortFunc(onAbort)
	}
	w.Init(seq, timing, h)
	return w
}

// Init sets up a zero HostWork in place, as NewHostWork does, with hook
// (if not nil) in place of onAbort: for a backend that keeps the work in
// its own record of the op, so that it costs no allocation. It must be
// called before the work is used, and only once.
func (w *HostWork) Init(seq uint64, timing bool, hook AbortHook) {
	w.seq, w.timing, w.onAbort = seq, timing, hook
}

// CompletedWork returns a HostWork that has already completed with outputs
// and err.
func CompletedWork(seq uint64, outputs []*tensor.Tensor, err error) *HostWork {
	w := NewHostWork(seq, false, nil)
	w.MarkStarted()
	w.Complete(outputs, err)
	return w
}

// MarkStarted records that a worker picked the op up, and when, if the
// work is timed.
func (w *HostWork) MarkStarted() {
	// The load first: Complete calls this on a started work, and a
	// failed CompareAndSwap is still a locked instruction. The start's
	// clock read is for Duration alone: an untimed work saves it.
	if !w.started.Load() && w.started.CompareAndSwap(false, true) && w.timing {
		w.start.Store(int64(Mono()))
	}
}

// Complete finishes the work. Later calls are ignored. It reports whether
// this call completed the work.
func (w *HostWork) Complete(outputs []*tensor.Tensor, err error) bool {
	w.MarkStarted()
	// Before the future: whoever sees it complete sees CompletedAt too.
	// The first caller stamps it (of two racing completers, the other
	// one may win the future, nanoseconds apart).
	w.endMono.CompareAndSwap(0, max(int64(Mono()), 1))
	return w.fut.Complete(outputs, err)
}

// CompletedAt returns when the work completed, on the Mono clock, or 0
// before it has: the dispatcher's metrics time a host op by it, however
// late they look.
func (w *HostWork) CompletedAt() time.Duration { return time.Duration(w.endMono.Load()) }

// Outcome returns, in one call, what the flight recorder notes of a
// completed work: when it completed (CompletedAt; 0, with the rest
// zero, while it has not), its Duration (timed false when timing was
// off) and its Exception. A completed HostWork has started.
func (w *HostWork) Outcome() (at, dur time.Duration, timed bool, err error) {
	at = time.Duration(w.endMono.Load())
	if at == 0 || !w.fut.IsDone() {
		return 0, 0, false, nil
	}
	if w.timing {
		dur, timed = at-time.Duration(w.start.Load()), true
	}
	return at, dur, timed, w.fut.err
}

// Wait implements Work: it blocks until the op completes.
func (w *HostWork) Wait(ctx context.Context) error {
	if !w.fut.IsDone() {
		<-w.fut.Done()
	}
	return w.fut.err
}

// BlockStream implements Work: with no stream to order, it blocks the host.
func (w *HostWork) BlockStream(Stream) error { return w.Wait(context.Background()) }

// WaitHost implements Work. When ctx ends first, the error is a
// *WaitError: the caller's deadline fired, not the op's.
func (w *HostWork) WaitHost(ctx context.Context) error {
	if w.fut.IsDone() {
		return w.fut.err
	}
	start := Mono()
	select {
	case <-w.fut.Done():
		return w.fut.err
	case <-ctx.Done():
		return &WaitError{Seq: w.seq, Rank: -1, Waited: Mono() - start, Err: ctx.Err()}
	}
}

// IsCompleted implements Work.
func (w *HostWork) IsCompleted() bool { return w.fut.IsDone() }

// IsStarted implements Work. Host works always know when they started.
func (w *HostWork) IsStarted() (bool, error) { return w.started.Load(), nil }

// Exception implements Work.
func (w *HostWork) Exception() error {
	if !w.fut.IsDone() {
		return nil
	}
	return w.fut.err
}

// Future implements Work.
func (w *HostWork) Future() *Future { return &w.fut }

// SeqNum implements Work.
func (w *HostWork) SeqNum() uint64 { return w.seq }

// Duration implements Work.
func (w *HostWork) Duration() (time.Duration, error) {
	if !w.timing {
		return 0, ErrNoTiming
	}
	if !w.fut.IsDone() {
		return 0, errors.New("duration requested before the op completed")
	}
	return time.Duration(w.endMono.Load() - w.start.Load()), nil
}

// Abort implements Work.
func (w *HostWork) Abort(reason error) {
	if w.fut.IsDone() {
		return
	}
	err := fmt.Errorf("%w: %w", ErrAborted, reason)
	if w.onAbort != nil {
		w.onAbort.OnAbort(err)
	}
	w.Complete(nil, err)
}

// Releaser is implemented by a Work whose backend can reuse its memory
// once nobody holds it. The dispatcher's blocking forms (AllreduceWait and
// the other ...Wait methods, c10d's async_op=False) return no Work; they
// call Release on the Work of an op whose Wait returned nil when nothing
// else kept it (no post hook saw it, and the flight recorder and the
// metrics have let go of it), so that a loop of small host ops allocates
// nothing per op. Release is called at most once, and the Work is not
// used after it; a backend that cannot prove that its own goroutines are
// done with the Work ignores the call.
type Releaser interface {
	Release()
}

// OutcomeReporter is implemented by a host work whose state is a few
// words, cheap to read on the issuing goroutine: HostWork, the works built
// on it, and ucc's. Outcome tells, in one call, what the dispatcher's
// flight recorder and the metrics note of the op once it has completed
// (HostWork.Outcome's contract: at, on the Mono clock, is 0, with the rest
// zero, until then). A completed Work that has it is one they need not
// keep: they look at it at once, and the blocking forms may hand it back
// to its backend (Releaser).
type OutcomeReporter interface {
	Outcome() (at, dur time.Duration, timed bool, err error)
}

// CaptureReporter is implemented by the Work of a backend whose ops can be
// captured into a CUDA graph. A captured op did not run: it runs at each
// replay of the graph, ordered by the stream the graph is launched on, so
// it is neither pending nor failed, and its events may not be queried. The
// flight recorder and the watchdogs leave such a Work alone, as
// ProcessGroupNCCL does; its host waits return at once and its Exception is
// nil.
type CaptureReporter interface {
	// Captured reports whether the op was captured rather than run.
	Captured() bool
}

// SourceRanker is implemented by the Work of RecvAnysource: it names the
// rank the message came from, once the work has completed.
type SourceRanker interface {
	SourceRank() (int, error)
}
