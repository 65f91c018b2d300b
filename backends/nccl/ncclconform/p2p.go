package ncclconform

import (
	"context"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/tensor"
)

// Point-to-point ops of the NCCL backend (one communicator per rank pair):
// a port of backends/nccl's TestP2P. The batched case issues its ops on the
// backend itself inside nccl.Coalesce, as the dispatcher has no block.

func init() { conformance.Define(defineNCCLP2P) }

func defineNCCLP2P(s *conformance.Suite) {
	Describe("nccl point to point", Label(conformance.LabelP2P), func() {
		It("send and recv on the pair communicator, each way, async and sync", func() {
			e := gpu(s)
			defer e.Close()
			s.Require(s.Size > 1, "needs two ranks")
			if s.Rank > 1 {
				return // the pair is ranks 0 and 1; the others only keep step
			}
			peer := 1 - s.Rank
			x := e.Fill(gpuN, func(i int) float64 { return float64(10*s.Rank + i%7) })
			y := e.Zeros(tensor.Float32, gpuN)
			for round := range 2 {
				async := round == 0
				var w backend.Work
				var err error
				if s.Rank == round {
					w, err = s.PG.Send(e.Ctx, []*tensor.Tensor{x}, peer, backend.SendOptions{Async: async})
				} else {
					w, err = s.PG.Recv(e.Ctx, []*tensor.Tensor{y}, peer, backend.RecvOptions{Async: async})
				}
				Expect(err).NotTo(HaveOccurred())
				Expect(w.Wait(e.Ctx)).To(Succeed())
			}
			expectAll(e.Read(y), func(i int) float64 { return float64(10*peer + i%7) }, "received")
		})

		It("batch_isend_irecv: a send and a receive in one coalescing block exchange both ways with one Work", Label(conformance.LabelCoalescing), func() {
			e := gpu(s)
			defer e.Close()
			s.Require(s.Size > 1, "needs two ranks")
			// A ring: each rank sends to the next and receives from the
			// previous, all in one NCCL group.
			next, prev := (s.Rank+1)%s.Size, (s.Rank+s.Size-1)%s.Size
			x := e.Fill(gpuN, func(i int) float64 { return float64(10*s.Rank + i%7) })
			z := e.Zeros(tensor.Float32, gpuN)
			w, err := nccl.Coalesce(e.Ctx, e.b, func(ctx context.Context) error {
				sw, err := e.b.Send(ctx, e.meta(backend.OpSend), []*tensor.Tensor{x}, next, backend.SendOptions{})
				if err != nil {
					return err
				}
				Expect(sw).To(BeNil())
				rw, err := e.b.Recv(ctx, e.meta(backend.OpRecv), []*tensor.Tensor{z}, prev, backend.RecvOptions{})
				Expect(rw).To(BeNil())
				return err
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(w).NotTo(BeNil())
			Expect(w.Wait(e.Ctx)).To(Succeed())
			expectAll(e.Read(z), func(i int) float64 { return float64(10*prev + i%7) }, "received in the block")
		})
	})
}
