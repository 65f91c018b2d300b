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

// env is conformance.GPU plus the staged backend serving the suite's CUDA
// tensors.
type env struct {
	*conformance.GPU
	b *stage.Backend
}

// gpu returns the spec's environment, or skips: "no CUDA device" when the
// run puts tensors elsewhere, or when CUDA tensors do not go to a staged
// backend. The caller defers e.Close().
func gpu(s *conformance.Suite) *env {
	GinkgoHelper()
	g, b := conformance.GPUFor[*stage.Backend](s, "the staged backends'")
	return &env{GPU: g, b: b}
}

// fill uploads n float32 elements, every one v.
func (e *env) fill(v float64) *tensor.Tensor {
	GinkgoHelper()
	return e.Fill(n, func(int) float64 { return v })
}

// internal is the staging stream of the spec's device.
func (e *env) internal() *cuda.Stream {
	GinkgoHelper()
	s, err := e.b.Stream(e.Ord)
	Expect(err).NotTo(HaveOccurred())
	cs, ok := s.(*cuda.Stream)
	Expect(ok).To(BeTrue(), "the staging stream is a %T", s)
	return cs
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
			defer e.Close()
			x := e.fill(float64(s.Rank + 1))
			g := e.NewGate()
			Expect(e.Cur.Synchronize()).To(Succeed())
			e.Hold(g, e.Cur)
			t0 := time.Now()
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(time.Since(t0)).To(BeNumerically("<", 200*time.Millisecond), "the op blocked the host")
			Consistently(w.IsCompleted, 100*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"IsCompleted turned true while the current stream is gated")
			g.Open()
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			Expect(w.IsCompleted()).To(BeTrue())
			Expect(w.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(x), sum(s), "allreduce")
		})

		It("Wait returns at once while the staging stream is held, and a copy queued after it on the current stream sees the result", func() {
			e := gpu(s)
			defer e.Close()
			x := e.fill(float64(s.Rank + 1))
			ns := e.internal()
			pin, ev, g := e.Pinned(4*n), e.Event(), e.NewGate()
			Expect(e.Cur.Synchronize()).To(Succeed())
			e.Hold(g, ns)
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			t0 := time.Now()
			Expect(w.Wait(e.Ctx)).To(Succeed())
			Expect(time.Since(t0)).To(BeNumerically("<", 100*time.Millisecond), "Wait blocked the host")
			Expect(cuda.CopyToPinned(e.Ctx, pin, x)).To(Succeed())
			Expect(ev.Record(e.Cur)).To(Succeed())
			Consistently(func() bool { done, _ := ev.Query(); return done }, 50*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"the copy after Wait ran while the op is held")
			Expect(w.IsCompleted()).To(BeFalse())
			g.Open()
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(ev.Wait(ctx)).To(Succeed())
			Expect(f32(pin, 0)).To(Equal(sum(s)))
			Expect(f32(pin, n-1)).To(Equal(sum(s)))
		})

		It("Wait under another stream orders only that stream; BlockStream orders a third", func() {
			e := gpu(s)
			defer e.Close()
			x := e.fill(float64(s.Rank + 1))
			other, third := e.Stream(), e.Stream()
			ns := e.internal()
			pinA, pinB := e.Pinned(4*n), e.Pinned(4*n)
			evA, evB, evC := e.Event(), e.Event(), e.Event()
			g := e.NewGate()
			Expect(e.Cur.Synchronize()).To(Succeed())
			e.Hold(g, ns)
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			ctxB := cuda.WithStream(context.Background(), other)
			Expect(w.Wait(ctxB)).To(Succeed())
			Expect(w.BlockStream(third)).To(Succeed())
			Expect(cuda.CopyToPinned(ctxB, pinB, x)).To(Succeed())
			Expect(evB.Record(other)).To(Succeed())
			Expect(evC.Record(third)).To(Succeed())
			Expect(cuda.CopyToPinned(e.Ctx, pinA, x)).To(Succeed())
			Expect(evA.Record(e.Cur)).To(Succeed())
			ctx, cancel := e.WaitCtx()
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
			defer e.Close()
			x := e.fill(float64(s.Rank + 1))
			ns := e.internal()
			g := e.NewGate()
			Expect(e.Cur.Synchronize()).To(Succeed())
			e.Hold(g, ns)
			w1, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			bw, err := s.PG.Barrier(e.Ctx, backend.BarrierOptions{})
			Expect(err).NotTo(HaveOccurred())
			done := make(chan error, 1)
			go func() { done <- bw.Wait(e.Ctx) }()
			Consistently(done, 50*time.Millisecond, 10*time.Millisecond).ShouldNot(Receive(), "the barrier returned while earlier work is held")
			g.Open()
			Eventually(done, 20*time.Second, time.Millisecond).Should(Receive(BeNil()))
			Expect(w1.IsCompleted()).To(BeTrue())
			expectAll(e.Read(x), sum(s), "allreduce before the barrier")
		})

		It("WaitHost honours its context while the op is held: a *backend.WaitError, and the op completes after", Label(conformance.LabelLifetime), func() {
			e := gpu(s)
			defer e.Close()
			x := e.fill(float64(s.Rank + 1))
			g := e.NewGate()
			Expect(e.Cur.Synchronize()).To(Succeed())
			e.Hold(g, e.Cur)
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancelShort()
			var we *backend.WaitError
			Expect(w.WaitHost(short)).To(BeAssignableToTypeOf(we))
			g.Open()
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			expectAll(e.Read(x), sum(s), "allreduce")
		})
	})
}
