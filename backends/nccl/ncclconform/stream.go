package ncclconform

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// Stream semantics of the NCCL backend (DESIGN.md "Semantics", the
// reference article's sections 3-4), proven with stream gates: ports of
// backends/nccl's TestAsyncReturnsWhileCurrentStreamGated,
// TestWaitOrdersOnlyTheWaitingStream, TestSyncModeRunsOnCurrentStream and
// TestBarrier, issued through the dispatcher.

func init() { conformance.Define(defineNCCLStream) }

// gpuN is the element count of the GPU specs' buffers.
const gpuN = 1024

func defineNCCLStream(s *conformance.Suite) {
	Describe("nccl stream semantics", Label(conformance.LabelStream, conformance.LabelAsync), func() {
		It("async: the op returns while the current stream is gated; IsCompleted stays false until the gate opens", func() {
			e := gpu(s)
			defer e.Close()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			g := e.NewGate()
			e.Sync()
			e.Hold(g, e.Cur)
			t0 := time.Now()
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(time.Since(t0)).To(BeNumerically("<", 200*time.Millisecond), "the async op blocked the host")
			// The internal stream waits on an event of the gated current
			// stream: the collective cannot have started.
			Consistently(w.IsCompleted, 100*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"IsCompleted turned true while the current stream is gated")
			g.Open()
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			Expect(w.IsCompleted()).To(BeTrue(), "IsCompleted false after WaitHost")
			Expect(w.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(x), func(int) float64 { return sumRanks(s) }, "allreduce")
		})

		It("Wait returns at once while the NCCL stream is held, and a copy queued after it on the current stream sees the reduced value", func() {
			e := gpu(s)
			defer e.Close()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			ns := e.ncclStream()
			pin := e.Pinned(4 * gpuN)
			ev := e.Event()
			g := e.NewGate()
			e.Sync()
			e.Hold(g, ns) // the NCCL stream is busy until the gate opens
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			t0 := time.Now()
			Expect(w.Wait(e.Ctx)).To(Succeed())
			Expect(time.Since(t0)).To(BeNumerically("<", 100*time.Millisecond), "Wait blocked the host")
			Expect(cuda.CopyToPinned(e.Ctx, pin, x)).To(Succeed())
			Expect(ev.Record(e.Cur)).To(Succeed())
			Consistently(func() bool { done, _ := ev.Query(); return done }, 50*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"the copy after Wait ran while the op is held")
			Expect(w.IsCompleted()).To(BeFalse(), "the op completed while the NCCL stream is gated")
			g.Open()
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(ev.Wait(ctx)).To(Succeed())
			for _, i := range []int{0, gpuN / 2, gpuN - 1} {
				Expect(pinnedF32(pin, i)).To(Equal(sumRanks(s)), "element %d of the copy after Wait", i)
			}
		})

		It("Wait under another stream than the producer's orders only that stream: it sees the result, the producer's stream does not wait", func() {
			e := gpu(s)
			defer e.Close()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			other := e.Stream()
			ns := e.ncclStream()
			pinA, pinB := e.Pinned(4*gpuN), e.Pinned(4*gpuN)
			evA, evB := e.Event(), e.Event()
			g := e.NewGate()
			e.Sync()
			e.Hold(g, ns)
			// Produced on A (the current stream), waited under B.
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			ctxB := cuda.WithStream(context.Background(), other)
			t0 := time.Now()
			Expect(w.Wait(ctxB)).To(Succeed())
			Expect(time.Since(t0)).To(BeNumerically("<", 100*time.Millisecond), "Wait blocked the host")
			Expect(cuda.CopyToPinned(ctxB, pinB, x)).To(Succeed())
			Expect(evB.Record(other)).To(Succeed())
			Expect(cuda.CopyToPinned(e.Ctx, pinA, x)).To(Succeed())
			Expect(evA.Record(e.Cur)).To(Succeed())
			ctx, cancel := e.WaitCtx()
			defer cancel()
			// A is not ordered after the op: its copy runs now, on the input.
			Expect(evA.Wait(ctx)).To(Succeed(), "stream A was held by a Wait issued under B")
			Expect(pinnedF32(pinA, 0)).To(Equal(float64(s.Rank+1)), "A's copy, unordered, sees the input")
			// B is: its copy waits for the gated op.
			Consistently(func() bool { done, _ := evB.Query(); return done }, 30*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"B's copy ran although B waited on the held op")
			Expect(w.IsCompleted()).To(BeFalse())
			g.Open()
			Expect(evB.Wait(ctx)).To(Succeed())
			Expect(pinnedF32(pinB, gpuN-1)).To(Equal(sumRanks(s)), "B's copy after Wait sees the reduced value")
		})

		It("sync mode: the kernel is on the current stream, so it cannot complete while that stream is gated; the host is not blocked", Label(conformance.LabelStream), func() {
			e := gpu(s)
			defer e.Close()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			g := e.NewGate()
			e.Sync()
			e.Hold(g, e.Cur)
			t0 := time.Now()
			w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(w.Wait(e.Ctx)).To(Succeed()) // a no-op in sync mode
			Expect(time.Since(t0)).To(BeNumerically("<", 200*time.Millisecond), "the sync-mode op blocked the host")
			nw, ok := w.(*nccl.Work)
			Expect(ok).To(BeTrue(), "the Work is %T, want *nccl.Work", w)
			Expect(nw.Stream().Handle()).To(Equal(e.Cur.Handle()), "the sync-mode kernel is not on the current stream")
			Consistently(w.IsCompleted, 50*time.Millisecond, 10*time.Millisecond).Should(BeFalse(),
				"the sync-mode op completed while its stream is gated")
			g.Open()
			expectAll(e.Read(x), func(int) float64 { return sumRanks(s) }, "allreduce")
			Expect(w.IsCompleted()).To(BeTrue())
		})

		It("barrier: its Wait blocks the host until the work issued before it, held on the NCCL stream, has completed", func() {
			e := gpu(s)
			defer e.Close()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			ns := e.ncclStream()
			g := e.NewGate()
			e.Sync()
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
			Expect(w1.IsCompleted()).To(BeTrue(), "the barrier returned before the earlier op completed")
			Expect(bw.IsCompleted()).To(BeTrue())
			Expect(w1.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(x), func(int) float64 { return sumRanks(s) }, "allreduce before the barrier")
		})
	})
}
