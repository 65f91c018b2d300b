package ncclconform

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/tensor"
)

// Every op × every dtype NCCL moves, async on a current stream of the
// spec's own, each result read on that stream right after Wait (which
// orders it after the op without blocking the host): a port of
// backends/nccl's TestEveryOpEveryDType. The backend-generic specs
// (spec_ops.go) run the same ops in sync mode on the default stream.

func init() { conformance.Define(defineNCCLDTypes) }

// ncclReduceOps are the reduce ops NCCL does on dt with world ranks; the
// others are refused (BAND/BOR/BXOR always, AVG and PREMUL_SUM of bool,
// PREMUL_SUM of integers, float8 PREMUL_SUM on one rank).
func ncclReduceOps(dt tensor.DType, world int) []backend.ReduceOp {
	ops := []backend.ReduceOp{backend.SUM, backend.PRODUCT, backend.MAX, backend.MIN}
	if dt != tensor.Bool {
		ops = append(ops, backend.AVG)
	}
	fp8 := dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2
	if dt.IsFloat() && !(world == 1 && fp8) {
		ops = append(ops, backend.PremulSum(2))
	}
	return ops
}

func defineNCCLDTypes(s *conformance.Suite) {
	Describe("nccl every op and dtype", Label(conformance.LabelDTypes, conformance.LabelAsync), func() {
		for _, dt := range tensor.DTypes() {
			It(fmt.Sprintf("every op on %s: async on the current stream, each result read after Wait", dt), func() {
				e := gpu(s)
				defer e.close()
				s.RequireDType(dt)
				const m = 6
				root := s.Size - 1
				done := func(name string, w backend.Work, err error) {
					GinkgoHelper()
					Expect(err).NotTo(HaveOccurred(), name)
					Expect(w).NotTo(BeNil(), name)
					Expect(w.Wait(e.ctx)).To(Succeed(), name)
				}
				row := func(r, n, salt int) []float64 {
					v := make([]float64, n)
					for i := range v {
						v[i] = conformance.Input(dt, backend.Sum, r, i+salt)
					}
					return v
				}
				concat := func(f func(r int) []float64) []float64 {
					var v []float64
					for r := range s.Size {
						v = append(v, f(r)...)
					}
					return v
				}

				// Reductions.
				for _, op := range ncclReduceOps(dt, s.Size) {
					mine, all := s.Inputs(dt, op.Type, m, 0)
					x := e.tensor(dt, mine)
					w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op, Async: true})
					done("allreduce "+op.String(), w, err)
					conformance.ExpectValues(dt, e.read(x), conformance.Reference(dt, op, all), "allreduce "+op.String())
				}
				mine, all := s.Inputs(dt, backend.Sum, m*s.Size, 1)
				sum := conformance.Reference(dt, backend.SUM, all)
				mySum := sum[s.Rank*m : (s.Rank+1)*m]
				x := e.tensor(dt, mine[:m])
				w, err := s.PG.Reduce(e.ctx, []*tensor.Tensor{x}, backend.ReduceOptions{RootRank: root, Async: true})
				done("reduce", w, err)
				if s.Rank == root {
					conformance.ExpectValues(dt, e.read(x), sum[:m], "reduce on the root")
				}
				out := e.zeros(dt, m)
				w, err = s.PG.ReduceScatterTensor(e.ctx, out, e.tensor(dt, mine), backend.ReduceScatterTensorOptions{Async: true})
				done("reduce_scatter_tensor", w, err)
				conformance.ExpectValues(dt, e.read(out), mySum, "reduce_scatter_tensor")
				blocks := make([]*tensor.Tensor, s.Size)
				for r := range blocks {
					blocks[r] = e.tensor(dt, mine[r*m:(r+1)*m])
				}
				out = e.zeros(dt, m)
				w, err = s.PG.ReduceScatter(e.ctx, []*tensor.Tensor{out}, [][]*tensor.Tensor{blocks}, backend.ReduceScatterOptions{Async: true})
				done("reduce_scatter", w, err)
				conformance.ExpectValues(dt, e.read(out), mySum, "reduce_scatter")
				c1, c2 := e.tensor(dt, mine[:m]), e.tensor(dt, mine)
				w, err = s.PG.AllreduceCoalesced(e.ctx, []*tensor.Tensor{c1, c2}, backend.AllreduceCoalescedOptions{Async: true})
				done("allreduce_coalesced", w, err)
				conformance.ExpectValues(dt, e.read(c1), sum[:m], "allreduce_coalesced, first tensor")
				conformance.ExpectValues(dt, e.read(c2), sum, "allreduce_coalesced, second tensor")
				o1, o2 := e.zeros(dt, m), e.zeros(dt, m)
				w, err = s.PG.ReduceScatterTensorCoalesced(e.ctx, []*tensor.Tensor{o1, o2}, []*tensor.Tensor{e.tensor(dt, mine), e.tensor(dt, mine)},
					backend.ReduceScatterTensorCoalescedOptions{Async: true})
				done("reduce_scatter_tensor_coalesced", w, err)
				conformance.ExpectValues(dt, e.read(o1), mySum, "reduce_scatter_tensor_coalesced, first output")
				conformance.ExpectValues(dt, e.read(o2), mySum, "reduce_scatter_tensor_coalesced, second output")

				// Data movement.
				b := e.tensor(dt, row(s.Rank, m, 2))
				w, err = s.PG.Broadcast(e.ctx, []*tensor.Tensor{b}, backend.BroadcastOptions{RootRank: root, Async: true})
				done("broadcast", w, err)
				conformance.ExpectValues(dt, e.read(b), row(root, m, 2), "broadcast")
				in := e.tensor(dt, row(s.Rank, m, 3))
				big := e.zeros(dt, m*s.Size)
				w, err = s.PG.AllgatherIntoTensor(e.ctx, big, in, backend.AllgatherIntoTensorOptions{Async: true})
				done("allgather_into_tensor", w, err)
				gathered := concat(func(r int) []float64 { return row(r, m, 3) })
				conformance.ExpectValues(dt, e.read(big), gathered, "allgather_into_tensor")
				outs := make([]*tensor.Tensor, s.Size)
				for r := range outs {
					outs[r] = e.zeros(dt, m)
				}
				w, err = s.PG.Allgather(e.ctx, [][]*tensor.Tensor{outs}, []*tensor.Tensor{in}, backend.AllgatherOptions{Async: true})
				done("allgather", w, err)
				for r, o := range outs {
					conformance.ExpectValues(dt, e.read(o), row(r, m, 3), fmt.Sprintf("allgather, block of rank %d", r))
				}
				f1, f2 := e.zeros(dt, m*s.Size), e.zeros(dt, m*s.Size)
				w, err = s.PG.AllgatherIntoTensorCoalesced(e.ctx, []*tensor.Tensor{f1, f2}, []*tensor.Tensor{in, in}, backend.AllgatherIntoTensorCoalescedOptions{Async: true})
				done("allgather_into_tensor_coalesced", w, err)
				conformance.ExpectValues(dt, e.read(f2), gathered, "allgather_into_tensor_coalesced")
				in2 := e.tensor(dt, row(s.Rank, m+1, 4))
				lists := [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)}
				for r := range s.Size {
					lists[0][r], lists[1][r] = e.zeros(dt, m), e.zeros(dt, m+1)
				}
				w, err = s.PG.AllgatherCoalesced(e.ctx, lists, []*tensor.Tensor{in, in2}, backend.AllgatherCoalescedOptions{Async: true})
				done("allgather_coalesced", w, err)
				for r := range s.Size {
					conformance.ExpectValues(dt, e.read(lists[0][r]), row(r, m, 3), "allgather_coalesced, first input")
					conformance.ExpectValues(dt, e.read(lists[1][r]), row(r, m+1, 4), "allgather_coalesced, second input")
				}
				// Block p of rank r's alltoall input is row(r, m, 10p).
				a2a := e.tensor(dt, concat(func(p int) []float64 { return row(s.Rank, m, 10*p) }))
				a2aOut := e.zeros(dt, m*s.Size)
				w, err = s.PG.AlltoallBase(e.ctx, a2aOut, a2a, backend.AlltoallBaseOptions{Async: true})
				done("alltoall_base", w, err)
				fromAll := concat(func(p int) []float64 { return row(p, m, 10*s.Rank) })
				conformance.ExpectValues(dt, e.read(a2aOut), fromAll, "alltoall_base")
				ins, outs2 := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
				for p := range s.Size {
					ins[p], outs2[p] = e.tensor(dt, row(s.Rank, m, 10*p)), e.zeros(dt, m)
				}
				w, err = s.PG.Alltoall(e.ctx, outs2, ins, backend.AlltoallOptions{Async: true})
				done("alltoall", w, err)
				for p, o := range outs2 {
					conformance.ExpectValues(dt, e.read(o), row(p, m, 10*s.Rank), fmt.Sprintf("alltoall, piece from rank %d", p))
				}
				var gl [][]*tensor.Tensor
				if s.Rank == root {
					gl = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						gl[0][r] = e.zeros(dt, m)
					}
				}
				w, err = s.PG.Gather(e.ctx, gl, []*tensor.Tensor{in}, backend.GatherOptions{RootRank: root, Async: true})
				done("gather", w, err)
				if s.Rank == root {
					for r, o := range gl[0] {
						conformance.ExpectValues(dt, e.read(o), row(r, m, 3), fmt.Sprintf("gather, from rank %d", r))
					}
				}
				var sl [][]*tensor.Tensor
				if s.Rank == root {
					sl = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						sl[0][r] = e.tensor(dt, row(r, m, 5))
					}
				}
				sout := e.zeros(dt, m)
				w, err = s.PG.Scatter(e.ctx, []*tensor.Tensor{sout}, sl, backend.ScatterOptions{RootRank: root, Async: true})
				done("scatter", w, err)
				conformance.ExpectValues(dt, e.read(sout), row(s.Rank, m, 5), "scatter")
				if s.Size > 1 {
					// Around the ring; even ranks send first (a receive
					// posted first would hold the stream behind it).
					next, prev := (s.Rank+1)%s.Size, (s.Rank+s.Size-1)%s.Size
					recv := e.zeros(dt, m)
					send := func() {
						w, err := s.PG.Send(e.ctx, []*tensor.Tensor{in}, next, backend.SendOptions{Async: true})
						done("send", w, err)
					}
					if s.Rank%2 == 0 {
						send()
					}
					w, err = s.PG.Recv(e.ctx, []*tensor.Tensor{recv}, prev, backend.RecvOptions{Async: true})
					done("recv", w, err)
					if s.Rank%2 == 1 {
						send()
					}
					conformance.ExpectValues(dt, e.read(recv), row(prev, m, 3), "received")
				}
			})
		}

		It("BAND, BOR and BXOR are refused with PyTorch's message", Label(conformance.LabelErrors), func() {
			e := gpu(s)
			defer e.close()
			x := e.tensor(tensor.Int32, []float64{1, 2, 3})
			for _, op := range []backend.ReduceOp{backend.BAND, backend.BOR, backend.BXOR} {
				w, err := s.PG.Allreduce(e.ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op})
				Expect(w).To(BeNil())
				Expect(err).To(MatchError(backend.ErrUnsupported))
				Expect(err.Error()).To(ContainSubstring("Cannot use ReduceOp." + op.String() + " with NCCL"))
			}
		})
	})
}
