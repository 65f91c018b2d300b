package ncclconform

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/tensor"
)

// Coalescing blocks of the NCCL backend: a port of backends/nccl's
// TestCoalescedBlockOneWork. The dispatcher has no coalescing block, so the
// spec issues its ops on the backend itself (nccl.Coalesce), with numbers
// of its own.

func init() { conformance.Define(defineNCCLCoalescing) }

func defineNCCLCoalescing(s *conformance.Suite) {
	Describe("nccl coalescing", Label(conformance.LabelCoalescing, conformance.LabelAsync), func() {
		It("a coalesced block gives one Work: its ops return none, and the block's Work covers them all", func() {
			e := gpu(s)
			defer e.Close()
			s.Require(s.Caps.Coalescing, "the backend has no coalescing blocks")
			var xs []*tensor.Tensor
			for k := range 3 {
				xs = append(xs, e.Fill(100+k, func(int) float64 { return float64(s.Rank + k) }))
			}
			ns := e.ncclStream()
			g := e.NewGate()
			e.Sync()
			e.Hold(g, ns)
			var inner []backend.Work
			w, err := nccl.Coalesce(e.Ctx, e.b, func(ctx context.Context) error {
				for _, x := range xs {
					iw, err := e.b.Allreduce(ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
					if err != nil {
						return err
					}
					inner = append(inner, iw)
				}
				return nil
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(w).NotTo(BeNil(), "no Work for the block")
			for i, iw := range inner {
				Expect(iw).To(BeNil(), "op %d inside the block returned a Work", i)
			}
			// One end event for the block: held with the NCCL stream, then
			// complete with every op's result in place.
			Consistently(w.IsCompleted, 30*time.Millisecond, 10*time.Millisecond).Should(BeFalse())
			g.Open()
			Expect(w.Wait(e.Ctx)).To(Succeed())
			for k, x := range xs {
				want := float64(s.Size*k) + sumRanks(s) - float64(s.Size)
				expectAll(e.Read(x), func(int) float64 { return want }, fmt.Sprintf("tensor %d", k))
			}
			Expect(w.IsCompleted()).To(BeTrue())
		})
	})
}
