package ncclconform

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// The GPU specs (nccl_*.go) port the proofs of backends/nccl's tests to the
// suite: they make streams busy deterministically with stream gates
// (cuda.Gate) and watch what the ops do meanwhile. GPU.md's trap rules
// them: while a gate is closed, anything that synchronises the device
// (communicator creation, cuMemAlloc, cuMemFreeHost, cuCtxSynchronize)
// hangs. So a spec makes its communicators, buffers, events and gates
// first, queues only stream-ordered work while a gate is closed, and opens
// every gate in a deferred call (gpuEnv.close) that runs on any exit,
// failures included. A safety timer opens them too, and fails the spec,
// should something hang regardless.

// gateSafety is how long a gate may stay closed before the safety timer
// opens it.
const gateSafety = 15 * time.Second

// gpuEnv is one GPU spec's view of this rank: its device, the nccl backend
// serving s.PG's CUDA tensors, a current stream of its own (non-blocking,
// as PyTorch's stream pool) and the context that carries it.
type gpuEnv struct {
	s   *conformance.Suite
	ord int
	dev *cuda.Device
	b   *nccl.Backend
	cur *cuda.Stream
	ctx context.Context // current stream: cur

	mu       sync.Mutex
	gates    []*cuda.Gate
	cleanups []func()
	timer    *time.Timer
	forced   atomic.Bool
}

// gpu returns the spec's GPU environment, or skips: "no CUDA device" when
// the run puts tensors elsewhere, or when CUDA tensors do not go to nccl.
// The caller defers e.close().
func gpu(s *conformance.Suite) *gpuEnv {
	GinkgoHelper()
	if s.Device.Type != tensor.CUDA {
		why := fmt.Sprintf("the suite runs on %s tensors with backend %q", s.Device, s.Backend)
		if err := cuda.Available(); err != nil {
			why = err.Error()
		}
		Skip("no CUDA device: " + why)
	}
	b, err := s.PG.Backend(tensor.CUDA)
	Expect(err).NotTo(HaveOccurred())
	nb, ok := b.(*nccl.Backend)
	if !ok {
		Skip(fmt.Sprintf("these specs are the nccl backend's; CUDA tensors go to %s here", b.Name()))
	}
	dev, err := cuda.GetDevice(s.Device.Index)
	Expect(err).NotTo(HaveOccurred())
	e := &gpuEnv{s: s, ord: s.Device.Index, dev: dev, b: nb}
	e.cur, err = dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	e.ctx = cuda.WithStream(context.Background(), e.cur)
	cur := e.cur
	e.defer_(func() { _ = cur.Destroy() })
	// Should a failure skip the deferred close (it cannot: it is deferred),
	// the suite still opens the gates before it makes a new group.
	s.OnSpecEnd(e.openAll)
	return e
}

// defer_ registers f to run in close, after every gate is open.
func (e *gpuEnv) defer_(f func()) {
	e.mu.Lock()
	e.cleanups = append(e.cleanups, f)
	e.mu.Unlock()
}

// openAll opens every gate. Safe from any goroutine, and idempotent.
func (e *gpuEnv) openAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.gates {
		g.Open()
	}
	if e.timer != nil {
		e.timer.Stop()
	}
}

// close opens the gates, then releases what the spec made (now that no
// stream is held, device-synchronising frees are safe), then frees the
// gates. It fails the spec if the safety timer had to open a gate.
func (e *gpuEnv) close() {
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

// newGate makes a closed gate. Make every gate a spec needs before holding
// any stream with one: creating a gate allocates pinned memory.
func (e *gpuEnv) newGate() *cuda.Gate {
	GinkgoHelper()
	g, err := e.dev.NewGate()
	Expect(err).NotTo(HaveOccurred())
	e.mu.Lock()
	e.gates = append(e.gates, g)
	e.mu.Unlock()
	return g
}

// hold makes s wait on g from now on, and arms the safety timer.
func (e *gpuEnv) hold(g *cuda.Gate, s *cuda.Stream) {
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

// stream makes another non-blocking stream.
func (e *gpuEnv) stream() *cuda.Stream {
	GinkgoHelper()
	st, err := e.dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() { _ = st.Destroy() })
	return st
}

// event makes an event (timing off).
func (e *gpuEnv) event() *cuda.Event {
	GinkgoHelper()
	ev, err := e.dev.NewEvent(false)
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() { _ = ev.Destroy() })
	return ev
}

// pinned makes n bytes of pinned host memory, for copies that must not
// block the host while a gate is closed.
func (e *gpuEnv) pinned(n int) *cuda.HostBuffer {
	GinkgoHelper()
	h, err := e.dev.HostAlloc(n, 0)
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() { _ = h.Free() })
	return h
}

// ncclStream is the internal stream async ops run on.
func (e *gpuEnv) ncclStream() *cuda.Stream {
	GinkgoHelper()
	ns, err := e.b.Stream(e.ctx, e.ord)
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// tensor uploads vals as dt on the current stream; the spec owns it (it is
// freed at close unless freed before).
func (e *gpuEnv) tensor(dt tensor.DType, vals []float64) *tensor.Tensor {
	GinkgoHelper()
	h, err := tensor.FromFloat64s(dt, vals)
	Expect(err).NotTo(HaveOccurred())
	t, err := cuda.FromHost(e.ctx, e.ord, h)
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() {
		if b := cuda.BufferOf(t); b != nil {
			_ = b.Free() // an error means the spec freed it already
		}
	})
	return t
}

// fill uploads n float32 elements f(i).
func (e *gpuEnv) fill(n int, f func(i int) float64) *tensor.Tensor {
	GinkgoHelper()
	v := make([]float64, n)
	for i := range v {
		v[i] = f(i)
	}
	return e.tensor(tensor.Float32, v)
}

// empty allocates n uninitialised float32 elements on the current stream.
func (e *gpuEnv) empty(dt tensor.DType, n int) *tensor.Tensor {
	GinkgoHelper()
	t, err := cuda.Empty(e.ctx, e.ord, dt, n)
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() {
		if b := cuda.BufferOf(t); b != nil {
			_ = b.Free()
		}
	})
	return t
}

// zeros allocates n zeroed elements of dt on the current stream.
func (e *gpuEnv) zeros(dt tensor.DType, n int) *tensor.Tensor {
	GinkgoHelper()
	t, err := cuda.Zeros(e.ctx, e.ord, dt, n)
	Expect(err).NotTo(HaveOccurred())
	e.defer_(func() {
		if b := cuda.BufferOf(t); b != nil {
			_ = b.Free()
		}
	})
	return t
}

// read copies t to the host on the current stream, waiting for the work
// queued before it there.
func (e *gpuEnv) read(t *tensor.Tensor) []float64 {
	GinkgoHelper()
	h, err := cuda.ToHost(e.ctx, t)
	Expect(err).NotTo(HaveOccurred())
	v, err := h.Float64s()
	Expect(err).NotTo(HaveOccurred())
	return v
}

// sync waits for the current stream (never while a gate holds it).
func (e *gpuEnv) sync() {
	GinkgoHelper()
	Expect(e.cur.Synchronize()).To(Succeed())
}

// waitCtx bounds a host wait in a spec; it ends early when the spec fails
// on another rank (conformance.Suite.Ctx).
func (e *gpuEnv) waitCtx() (context.Context, context.CancelFunc) {
	sctx, scancel := e.s.Ctx()
	ctx, cancel := context.WithTimeout(sctx, 20*time.Second)
	return ctx, func() { cancel(); scancel() }
}

// meta numbers an op that a spec issues on the backend directly (the
// dispatcher has no coalescing blocks).
func (e *gpuEnv) meta(op backend.Op) backend.Meta {
	return backend.Meta{Op: op, Seq: e.s.NextSeq(), Timeout: e.s.Timeout}
}

// pinnedF32 reads float32 element i of pinned memory.
func pinnedF32(h *cuda.HostBuffer, i int) float64 {
	b := h.Bytes()[4*i : 4*i+4]
	return float64(math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24))
}

// f32bits is the bit pattern of a float32, for Memset32.
func f32bits(f float32) uint32 { return math.Float32bits(f) }

// expectAll fails unless every element of got is want(i).
func expectAll(got []float64, want func(i int) float64, what string) {
	GinkgoHelper()
	for i, g := range got {
		if w := want(i); g != w {
			Fail(fmt.Sprintf("%s: element %d is %v, want %v", what, i, g, w))
		}
	}
}

// sumRanks is 1 + 2 + ... + size: the sum of every rank's rank+1.
func sumRanks(s *conformance.Suite) float64 { return float64(s.Size * (s.Size + 1) / 2) }
