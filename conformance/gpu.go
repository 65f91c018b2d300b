package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// The GPU specs of the backends' extensions (backends/nccl/ncclconform,
// internal/stage/stageconform) prove stream semantics: they make streams
// busy deterministically with stream gates (cuda.Gate) and watch what the
// ops do meanwhile. GPU.md's trap rules them: while a gate is closed,
// anything that synchronises the device (communicator creation,
// cuMemAlloc, cuMemFreeHost, cuCtxSynchronize) hangs. So a spec makes its
// communicators, buffers, events and gates first, queues only
// stream-ordered work while a gate is closed, and opens every gate in a
// deferred GPU.Close that runs on any exit, failures included. A safety
// timer opens them too, and fails the spec, should something hang
// regardless.

// gateSafety is how long a gate may stay closed before the safety timer
// opens it.
const gateSafety = 15 * time.Second

// GPU is one GPU spec's view of this rank: its device, a current stream of
// its own (non-blocking, as PyTorch's stream pool) and the context that
// carries it, and what the spec made, to release at Close. An extension
// embeds it beside the backend its specs are about.
type GPU struct {
	S   *Suite
	Ord int             // the device's ordinal
	Dev *cuda.Device    // the suite's device
	Cur *cuda.Stream    // the spec's current stream
	Ctx context.Context // carries Cur (cuda.WithStream)

	mu       sync.Mutex
	gates    []*cuda.Gate
	cleanups []func()
	timer    *time.Timer
	forced   atomic.Bool
}

// NewGPU returns the spec's GPU environment, or skips with "no CUDA
// device" when the suite's tensors are elsewhere. The caller defers
// Close.
func NewGPU(s *Suite) *GPU {
	GinkgoHelper()
	if s.Device.Type != tensor.CUDA {
		why := fmt.Sprintf("the suite runs on %s tensors with backend %q", s.Device, s.Backend)
		if err := cuda.Available(); err != nil {
			why = err.Error()
		}
		Skip("no CUDA device: " + why)
	}
	dev, err := cuda.GetDevice(s.Device.Index)
	Expect(err).NotTo(HaveOccurred())
	e := &GPU{S: s, Ord: s.Device.Index, Dev: dev}
	e.Cur, err = dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	e.Ctx = cuda.WithStream(context.Background(), e.Cur)
	cur := e.Cur
	e.Defer(func() { _ = cur.Destroy() })
	// Should a failure skip the deferred Close (it cannot: it is
	// deferred), the suite still opens the gates before it makes a new
	// group.
	s.OnSpecEnd(e.openAll)
	return e
}

// GPUFor is NewGPU for the specs of one backend type B: it also returns
// the backend that serves the suite's CUDA tensors, or skips when that is
// not a B (whose names the specs' owner, as "the nccl backend's").
func GPUFor[B backend.Backend](s *Suite, whose string) (*GPU, B) {
	GinkgoHelper()
	var b B
	if s.Device.Type == tensor.CUDA {
		be, err := s.PG.Backend(tensor.CUDA)
		Expect(err).NotTo(HaveOccurred())
		var ok bool
		if b, ok = be.(B); !ok {
			Skip(fmt.Sprintf("these specs are %s; CUDA tensors go to %s here", whose, be.Name()))
		}
	}
	return NewGPU(s), b // NewGPU skips off CUDA
}

// Defer registers f to run in Close, after every gate is open; Close runs
// them in reverse order.
func (e *GPU) Defer(f func()) {
	e.mu.Lock()
	e.cleanups = append(e.cleanups, f)
	e.mu.Unlock()
}

// openAll opens every gate. Safe from any goroutine, and idempotent.
func (e *GPU) openAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.gates {
		g.Open()
	}
	if e.timer != nil {
		e.timer.Stop()
	}
}

// Close opens the gates, then releases what the spec made (now that no
// stream is held, device-synchronising frees are safe), then frees the
// gates. It fails the spec if the safety timer had to open a gate.
func (e *GPU) Close() {
	e.openAll()
	e.mu.Lock()
	cleanups, gates := e.cleanups, e.gates
	e.cleanups, e.gates = nil, nil
	e.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	for _, g := range gates {
		_ = g.Free()
	}
	if e.forced.Load() {
		Fail(fmt.Sprintf("a stream gate stayed closed %v: the safety timer opened it (something waited on a gated stream)", gateSafety))
	}
}

// NewGate makes a closed gate. Make every gate a spec needs before holding
// any stream with one: creating a gate allocates pinned memory.
func (e *GPU) NewGate() *cuda.Gate {
	GinkgoHelper()
	g, err := e.Dev.NewGate()
	Expect(err).NotTo(HaveOccurred())
	e.mu.Lock()
	e.gates = append(e.gates, g)
	e.mu.Unlock()
	return g
}

// Hold makes s wait on g from now on, and arms the safety timer.
func (e *GPU) Hold(g *cuda.Gate, s *cuda.Stream) {
	GinkgoHelper()
	e.mu.Lock()
	if e.timer == nil {
		e.timer = time.AfterFunc(gateSafety, func() {
			e.forced.Store(true)
			e.openAll()
		})
	}
	e.mu.Unlock()
	Expect(g.Hold(s)).To(Succeed())
}

// Stream makes another non-blocking stream.
func (e *GPU) Stream() *cuda.Stream {
	GinkgoHelper()
	st, err := e.Dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	e.Defer(func() { _ = st.Destroy() })
	return st
}

// Event makes an event (timing off).
func (e *GPU) Event() *cuda.Event {
	GinkgoHelper()
	ev, err := e.Dev.NewEvent(false)
	Expect(err).NotTo(HaveOccurred())
	e.Defer(func() { _ = ev.Destroy() })
	return ev
}

// Pinned makes n bytes of pinned host memory, for copies that must not
// block the host while a gate is closed.
func (e *GPU) Pinned(n int) *cuda.HostBuffer {
	GinkgoHelper()
	h, err := e.Dev.HostAlloc(n, 0)
	Expect(err).NotTo(HaveOccurred())
	e.Defer(func() { _ = h.Free() })
	return h
}

// own frees t's device memory at Close, unless the spec freed it before.
func (e *GPU) own(t *tensor.Tensor) *tensor.Tensor {
	e.Defer(func() {
		if b := cuda.BufferOf(t); b != nil {
			_ = b.Free() // an error means the spec freed it already
		}
	})
	return t
}

// Tensor uploads vals as dt on the current stream; the spec owns it (it is
// freed at Close unless freed before).
func (e *GPU) Tensor(dt tensor.DType, vals []float64) *tensor.Tensor {
	GinkgoHelper()
	h, err := tensor.FromFloat64s(dt, vals)
	Expect(err).NotTo(HaveOccurred())
	t, err := cuda.FromHost(e.Ctx, e.Ord, h)
	Expect(err).NotTo(HaveOccurred())
	return e.own(t)
}

// Fill uploads n float32 elements f(i).
func (e *GPU) Fill(n int, f func(i int) float64) *tensor.Tensor {
	GinkgoHelper()
	v := make([]float64, n)
	for i := range v {
		v[i] = f(i)
	}
	return e.Tensor(tensor.Float32, v)
}

// Empty allocates n uninitialised elements of dt on the current stream.
func (e *GPU) Empty(dt tensor.DType, n int) *tensor.Tensor {
	GinkgoHelper()
	t, err := cuda.Empty(e.Ctx, e.Ord, dt, n)
	Expect(err).NotTo(HaveOccurred())
	return e.own(t)
}

// Zeros allocates n zeroed elements of dt on the current stream.
func (e *GPU) Zeros(dt tensor.DType, n int) *tensor.Tensor {
	GinkgoHelper()
	t, err := cuda.Zeros(e.Ctx, e.Ord, dt, n)
	Expect(err).NotTo(HaveOccurred())
	return e.own(t)
}

// Read copies t to the host on the current stream, waiting for the work
// queued before it there.
func (e *GPU) Read(t *tensor.Tensor) []float64 {
	GinkgoHelper()
	h, err := cuda.ToHost(e.Ctx, t)
	Expect(err).NotTo(HaveOccurred())
	v, err := h.Float64s()
	Expect(err).NotTo(HaveOccurred())
	return v
}

// Sync waits for the current stream (never while a gate holds it).
func (e *GPU) Sync() {
	GinkgoHelper()
	Expect(e.Cur.Synchronize()).To(Succeed())
}

// WaitCtx bounds a host wait in a spec; it ends early when the spec fails
// on another rank (Suite.Ctx).
func (e *GPU) WaitCtx() (context.Context, context.CancelFunc) {
	sctx, scancel := e.S.Ctx()
	ctx, cancel := context.WithTimeout(sctx, 20*time.Second)
	return ctx, func() { cancel(); scancel() }
}
