package ncclconform

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/backends/nccl/internal/ncclhook"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// Tensor lifetime under async ops (DESIGN.md "Memory", the reference
// article's stash and rule 4): ports of backends/nccl's TestLifetimeStash
// and TestSideStreamInput.

func init() { conformance.Define(defineNCCLLifetime) }

// freeAndReuse is the lifetime program: an async allgather_into_tensor is
// issued while the NCCL stream is gated, its input is freed at once, and a
// buffer of the same size is allocated and filled with 7.0 on the current
// stream, which runs before the gate opens. It returns the output and
// whether the allocator handed the freed input's memory back.
func freeAndReuse(e *gpuEnv, b backend.Backend, issue func(out, in *tensor.Tensor) (backend.Work, error)) (got []float64, reused bool) {
	GinkgoHelper()
	s := e.S
	in := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
	out := e.Empty(tensor.Float32, gpuN*s.Size)
	ns, err := b.(*nccl.Backend).Stream(e.Ctx, e.Ord)
	Expect(err).NotTo(HaveOccurred())
	ev := e.Event()
	g := e.NewGate()
	e.Sync()
	e.Hold(g, ns)
	old := in.Ptr()
	w, err := issue(out, in)
	Expect(err).NotTo(HaveOccurred())
	Expect(in.Free()).To(Succeed()) // the user drops the input before Wait
	y := e.Empty(tensor.Float32, gpuN)
	reused = y.Ptr() == old
	Expect(e.Cur.Memset32(y.Ptr(), f32bits(7), gpuN)).To(Succeed())
	// The memset runs before the collective can.
	Expect(ev.Record(e.Cur)).To(Succeed())
	ctx, cancel := e.WaitCtx()
	defer cancel()
	Expect(ev.Wait(ctx)).To(Succeed())
	g.Open()
	Expect(w.Wait(e.Ctx)).To(Succeed())
	return e.Read(out), reused
}

func defineNCCLLifetime(s *conformance.Suite) {
	Describe("nccl tensor lifetime", Label(conformance.LabelLifetime, conformance.LabelAsync), func() {
		It("with the stash, an input freed right after an async op is not reused until Wait, and the result is correct", func() {
			e := gpu(s)
			defer e.Close()
			got, reused := freeAndReuse(e, e.b, func(out, in *tensor.Tensor) (backend.Work, error) {
				return s.PG.AllgatherIntoTensor(e.Ctx, out, in, backend.AllgatherIntoTensorOptions{Async: true})
			})
			Expect(reused).To(BeFalse(), "the allocator reused a stashed input")
			expectAll(got, func(i int) float64 { return float64(i/gpuN + 1) }, "allgather_into_tensor")
		})

		It("without the stash (test-only knob ncclhook.Knobs.DisableStash), the same program reads the freed input's reused memory and is corrupted", func() {
			e := gpu(s)
			defer e.Close()
			// A backend of its own, with the test-only option; every rank
			// makes it at this point, before any gate closes.
			ctx, cancel := s.Ctx()
			defer cancel()
			opts := e.b.Options()
			ncclhook.Set(&opts, ncclhook.Knobs{DisableStash: true})
			st, err := store.NewPrefixStore(fmt.Sprintf("nostash/%d", s.SpecIndex()), s.Store())
			Expect(err).NotTo(HaveOccurred())
			dev := s.Device
			nb, err := nccl.New(ctx, backend.Config{Store: st, Rank: s.Rank, WorldSize: s.Size, GroupName: fmt.Sprintf("conformance_nostash_%d", s.SpecIndex()),
				GroupDesc: "conformance:nostash", Timeout: s.Timeout, Device: &dev, Options: &opts})
			Expect(err).NotTo(HaveOccurred())
			e.Defer(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				_ = nb.Close(ctx)
			})
			s.OnSpecEnd(func() { // after a failure, before the suite makes a new group
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = nb.Abort(ctx, fmt.Errorf("conformance: spec over"))
			})
			got, reused := freeAndReuse(e, nb, func(out, in *tensor.Tensor) (backend.Work, error) {
				return nb.AllgatherIntoTensor(e.Ctx, e.meta(backend.OpAllgatherIntoTensor), out, in, backend.AllgatherIntoTensorOptions{Async: true})
			})
			if !reused {
				Skip("the allocator did not hand the freed input's memory back, so the corruption was not provoked")
			}
			// This rank's block of the output comes from its own input,
			// which the op read after the memset wrote 7.0 into it.
			expectAll(got[s.Rank*gpuN:(s.Rank+1)*gpuN], func(int) float64 { return 7 }, "this rank's block, read from the freed input")
			AddReportEntry("corruption", fmt.Sprintf("rank %d: block %d of the output holds 7.0 (the new buffer's fill), not the input %d", s.Rank, s.Rank, s.Rank+1))
		})

		It("rule 4: an input written on a side stream is safe only once the current stream waits on that stream", Label(conformance.LabelStream), func() {
			e := gpu(s)
			defer e.Close()
			side := e.Stream()
			link := e.Event()
			x := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			out := e.Empty(tensor.Float32, gpuN*s.Size)
			g1, g2 := e.NewGate(), e.NewGate()
			e.Sync()
			ctx, cancel := e.WaitCtx()
			defer cancel()

			// Unsafe: the side stream's write (x = 5) is pending and the
			// current stream does not wait on it: the op reads the old x.
			e.Hold(g1, side)
			Expect(side.Memset32(x.Ptr(), f32bits(5), gpuN)).To(Succeed())
			w, err := s.PG.AllgatherIntoTensor(e.Ctx, out, x, backend.AllgatherIntoTensorOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			Expect(w.WaitHost(ctx)).To(Succeed(), "the op did not run ahead of the side stream")
			Expect(w.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(out), func(i int) float64 { return float64(i/gpuN + 1) }, "unsafe case: the op read x before the side stream wrote it")
			g1.Open()
			Expect(side.Synchronize()).To(Succeed())

			// Safe: the current stream waits on the side stream first.
			e.Hold(g2, side)
			Expect(side.Memset32(x.Ptr(), f32bits(6), gpuN)).To(Succeed())
			Expect(e.Cur.WaitStream(side, link)).To(Succeed())
			w, err = s.PG.AllgatherIntoTensor(e.Ctx, out, x, backend.AllgatherIntoTensorOptions{Async: true})
			Expect(err).NotTo(HaveOccurred())
			Consistently(w.IsCompleted, 30*time.Millisecond, 10*time.Millisecond).Should(BeFalse(), "the op ran before the side stream produced its input")
			g2.Open()
			Expect(w.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(out), func(int) float64 { return 6 }, "safe case")
		})
	})
}
