//go:build cgo

// Package stageconform is the conformance suite's part for host backends
// that take CUDA tensors by staging (internal/stage: cpupool and ucc with
// "cuda:cpupool" or "cuda:ucc"): the stream semantics, proven with stream
// gates as backends/nccl/ncclconform proves nccl's. It registers the specs
// from init; link it with a blank import. The specs skip unless the suite's
// CUDA tensors go to a staged backend.
//
// GPU.md's trap rules them as nccl's: everything is made before a gate
// closes, only stream-ordered work is queued while one is closed, and
// every gate opens in a deferred call (and by a safety timer).
package stageconform

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/stage"
	"github.com/gocoll/gocoll/tensor"
)

func init() { conformance.Define(define) }

const n = 1024 // float32 elements of the specs' tensors

// env is one spec's GPU state: the staged backend, a current stream of
// its own and the context carrying it, and what to release at the end.
type env struct {
	s    *conformance.Suite
	dev  *cuda.Device
	b    *stage.Backend
	cur  *cuda.Stream
	ctx  context.Context
	mu   sync.Mutex
	gts  []*cuda.Gate
	undo []func()
	tm   *time.Timer
}

func gpu(s *conformance.Suite) *env {
	GinkgoHelper()
	if s.Device.Type != tensor.CUDA {
		Skip(fmt.Sprintf("no CUDA device: the suite runs on %s tensors", s.Device))
	}
	b, err := s.PG.Backend(tensor.CUDA)
	Expect(err).NotTo(HaveOccurred())
	sb, ok := b.(*stage.Backend)
	if !ok {
		Skip(fmt.Sprintf("these specs are the staged backends'; CUDA tensors go to %s here", b.Name()))
	}
	dev, err := cuda.GetDevice(s.Device.Index)
	Expect(err).NotTo(HaveOccurred())
	e := &env{s: s, dev: dev, b: sb}
	e.cur, err = dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	cur := e.cur
	e.undo = append(e.undo, func() { _ = cur.Destroy() })
	e.ctx = cuda.WithStream(context.Background(), e.cur)
	s.OnSpecEnd(e.openAll)
	return e
}

func (e *env) openAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.gts {
		g.Open()
	}
	if e.tm != nil {
		e.tm.Stop()
	}
}

func (e *env) close() {
	e.openAll()
	_ = e.cur.Synchronize()
	for i := len(e.undo) - 1; i >= 0; i-- {
		e.undo[i]()
	}
	for _, g := range e.gts {
		_ = g.Free()
	}
}

func (e *env) gate() *cuda.Gate {
	GinkgoHelper()
	g, err := e.dev.NewGate()
	Expect(err).NotTo(HaveOccurred())
	e.mu.Lock()
	e.gts = append(e.gts, g)
	e.mu.Unlock()
	return g
}

func (e *env) hold(g *cuda.Gate, s *cuda.Stream) {
	GinkgoHelper()
	e.mu.Lock()
	if e.tm == nil {
		e.tm = time.AfterFunc(15*time.Second, e.openAll)
	}
	e.mu.Unlock()
	Expect(g.Hold(s)).To(Succeed())
}

func (e *env) fill(v float64) *tensor.Tensor {
	GinkgoHelper()
	h := tensor.New(tensor.Float32, n)
	h.Fill(v)
	t, err := cuda.FromHost(e.ctx, e.dev.Ordinal(), h)
	Expect(err).NotTo(HaveOccurred())
	e.undo = append(e.undo, func() { _ = t.Free() })
	return t
}

func (e *env) pinned() *cuda.HostBuffer {
	GinkgoHelper()
	h, err := e.dev.HostAlloc(4*n, 0)
	Expect(err).NotTo(HaveOccurred())
	e.undo = append(e.undo, func() { _ = h.Free() })
	return h
}

func (e *env) event() *cuda.Event {
	GinkgoHelper()
	ev, err := e.dev.NewEvent(false)
	Expect(err).NotTo(HaveOccurred())
	e.undo = append(e.undo, func() { _ = ev.Destroy() })
	return ev
}

func (e *env) stream() *cuda.Stream {
	GinkgoHelper()
	st, err := e.dev.NewStream(cuda.StreamOptions{})
	Expect(err).NotTo(HaveOccurred())
	e.undo = append(e.undo, func() { _ = st.Destroy() })
	return st
}

// internal is the staging stream of the spec's device.
func (e *env) internal() *cuda.Stream {
	GinkgoHelper()
	s, err := e.b.Stream(e.dev.Ordinal())
	Expect(err).NotTo(HaveOccurred())
	cs, ok := s.(*cuda.Stream)
	Expect(ok).To(BeTrue(), "the staging stream is a %T", s)
	return cs
}

func (e *env) read(t *tensor.Tensor) []float64 {
	GinkgoHelper()
	h, err := cuda.ToHost(e.ctx, t)
	Expect(err).NotTo(HaveOccurred())
	v, err := h.Float64s()
	Expect(err).NotTo(HaveOccurred())
	return v
}

func (e *env) waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

func f32(h *cuda.HostBuffer, i int) float64 {
	v, _ := tensor.FromBytes(tensor.Float32, h.Bytes()[4*i:4*i+4], 1)
	return v.At(0)
}

func sum(s *conformance.Suite) float64 { return float64(s.Size * (s.Size + 1) / 2) }

func expectAll(v []float64, want float64, what string) {
	GinkgoHelper()
	for _, i := range []int{0, len(v) / 2, len(v) - 1} {
		Expect(v[i]).To(Equal(want), "%s element %d", what, i)
	}
}

func define(s *conformance.Suite) {
	Describe("staged CUDA stream semantics", Label(conformance.LabelStream, conformance.LabelAsync), func() {
		It("the op returns while the current stream is gated; IsCompleted stays false until the gate opens", func() {
			e := gpu(s)
			defer e.close()
			x := e.fill(float64(s.Rank + 1))
			g := e.gate()
			Expect(e.cur.Synchronize()).To(Succeed())
			e.hold(g, e.cur)
			t0 := time.Now()
			w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(time.Since(t0)).To(BeNumerically("<", 200*time.Millisecond), "the op blocked the host")
			Consistently(w.IsCompleted, 100*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"IsCompleted turned true while the current stream is gated")
			g.Open()
			ctx, cancel := e.waitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			Expect(w.IsCompleted()).To(BeTrue())
			Expect(w.Wait(e.ctx)).To(Succeed())
			expectAll(e.read(x), sum(s), "allreduce")
		})

		It("Wait returns at once while the staging stream is held, and a copy queued after it on the current stream sees the result", func() {
			e := gpu(s)
			defer e.close()
			x := e.fill(float64(s.Rank + 1))
			ns := e.internal()
			pin, ev, g := e.pinned(), e.event(), e.gate()
			Expect(e.cur.Synchronize()).To(Succeed())
			e.hold(g, ns)
			w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			t0 := time.Now()
			Expect(w.Wait(e.ctx)).To(Succeed())
			Expect(time.Since(t0)).To(BeNumerically("<", 100*time.Millisecond), "Wait blocked the host")
			Expect(cuda.CopyToPinned(e.ctx, pin, x)).To(Succeed())
			Expect(ev.Record(e.cur)).To(Succeed())
			Consistently(func() bool { done, _ := ev.Query(); return done }, 50*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"the copy after Wait ran while the op is held")
			Expect(w.IsCompleted()).To(BeFalse())
			g.Open()
			ctx, cancel := e.waitCtx()
			defer cancel()
			Expect(ev.Wait(ctx)).To(Succeed())
			Expect(f32(pin, 0)).To(Equal(sum(s)))
			Expect(f32(pin, n-1)).To(Equal(sum(s)))
		})

		It("Wait under another stream orders only that stream; BlockStream orders a third", func() {
			e := gpu(s)
			defer e.close()
			x := e.fill(float64(s.Rank + 1))
			other, third := e.stream(), e.stream()
			ns := e.internal()
			pinA, pinB := e.pinned(), e.pinned()
			evA, evB, evC := e.event(), e.event(), e.event()
			g := e.gate()
			Expect(e.cur.Synchronize()).To(Succeed())
			e.hold(g, ns)
			w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			ctxB := cuda.WithStream(context.Background(), other)
			Expect(w.Wait(ctxB)).To(Succeed())
			Expect(w.BlockStream(third)).To(Succeed())
			Expect(cuda.CopyToPinned(ctxB, pinB, x)).To(Succeed())
			Expect(evB.Record(other)).To(Succeed())
			Expect(evC.Record(third)).To(Succeed())
			Expect(cuda.CopyToPinned(e.ctx, pinA, x)).To(Succeed())
			Expect(evA.Record(e.cur)).To(Succeed())
			ctx, cancel := e.waitCtx()
			defer cancel()
			Expect(evA.Wait(ctx)).To(Succeed(), "the current stream was held by a Wait issued under another")
			Expect(f32(pinA, 0)).To(Equal(float64(s.Rank+1)), "the unordered copy sees the input")
			Consistently(func() bool { b, _ := evB.Query(); c, _ := evC.Query(); return b || c }, 30*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"a stream ordered after the held op ran on")
			g.Open()
			Expect(evB.Wait(ctx)).To(Succeed())
			Expect(evC.Wait(ctx)).To(Succeed())
			Expect(f32(pinB, n-1)).To(Equal(sum(s)))
		})

		It("a barrier's Wait blocks the host until the staged op before it, held, has completed", func() {
			e := gpu(s)
			defer e.close()
			x := e.fill(float64(s.Rank + 1))
			ns := e.internal()
			g := e.gate()
			Expect(e.cur.Synchronize()).To(Succeed())
			e.hold(g, ns)
			w1, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			bw, err := s.PG.Barrier(e.ctx, backend.BarrierOptions{})
			Expect(err).NotTo(HaveOccurred())
			done := make(chan error, 1)
			go func() { done <- bw.Wait(e.ctx) }()
			Consistently(done, 50*time.Millisecond, 10*time.Millisecond).ShouldNot(Receive(), "the barrier returned while earlier work is held")
			g.Open()
			Eventually(done, 20*time.Second, time.Millisecond).Should(Receive(BeNil()))
			Expect(w1.IsCompleted()).To(BeTrue())
			expectAll(e.read(x), sum(s), "allreduce before the barrier")
		})

		It("WaitHost honours its context while the op is held: a *backend.WaitError, and the op completes after", Label(conformance.LabelLifetime), func() {
			e := gpu(s)
			defer e.close()
			x := e.fill(float64(s.Rank + 1))
			g := e.gate()
			Expect(e.cur.Synchronize()).To(Succeed())
			e.hold(g, e.cur)
			w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancelShort()
			var we *backend.WaitError
			Expect(w.WaitHost(short)).To(BeAssignableToTypeOf(we))
			g.Open()
			ctx, cancel := e.waitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			expectAll(e.read(x), sum(s), "allreduce")
		})
	})
}
