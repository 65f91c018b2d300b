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
				defer e.Close()
				s.RequireDType(dt)
				const m = 6
				root := s.Size - 1
				done := func(name string, w backend.Work, err error) {
					GinkgoHelper()
					Expect(err).NotTo(HaveOccurred(), name)
					Expect(w).NotTo(BeNil(), name)
					Expect(w.Wait(e.Ctx)).To(Succeed(), name)
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
					x := e.Tensor(dt, mine)
					w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op, Async: true})
					done("allreduce "+op.String(), w, err)
					conformance.ExpectValues(dt, e.Read(x), conformance.Reference(dt, op, all), "allreduce "+op.String())
				}
				mine, all := s.Inputs(dt, backend.Sum, m*s.Size, 1)
				sum := conformance.Reference(dt, backend.SUM, all)
				mySum := sum[s.Rank*m : (s.Rank+1)*m]
				x := e.Tensor(dt, mine[:m])
				w, err := s.PG.Reduce(e.Ctx, []*tensor.Tensor{x}, backend.ReduceOptions{RootRank: root, Async: true})
				done("reduce", w, err)
				if s.Rank == root {
					conformance.ExpectValues(dt, e.Read(x), sum[:m], "reduce on the root")
				}
				out := e.Zeros(dt, m)
				w, err = s.PG.ReduceScatterTensor(e.Ctx, out, e.Tensor(dt, mine), backend.ReduceScatterTensorOptions{Async: true})
				done("reduce_scatter_tensor", w, err)
				conformance.ExpectValues(dt, e.Read(out), mySum, "reduce_scatter_tensor")
				blocks := make([]*tensor.Tensor, s.Size)
				for r := range blocks {
					blocks[r] = e.Tensor(dt, mine[r*m:(r+1)*m])
				}
				out = e.Zeros(dt, m)
				w, err = s.PG.ReduceScatter(e.Ctx, []*tensor.Tensor{out}, [][]*tensor.Tensor{blocks}, backend.ReduceScatterOptions{Async: true})
				done("reduce_scatter", w, err)
				conformance.ExpectValues(dt, e.Read(out), mySum, "reduce_scatter")
				c1, c2 := e.Tensor(dt, mine[:m]), e.Tensor(dt, mine)
				w, err = s.PG.AllreduceCoalesced(e.Ctx, []*tensor.Tensor{c1, c2}, backend.AllreduceCoalescedOptions{Async: true})
				done("allreduce_coalesced", w, err)
				conformance.ExpectValues(dt, e.Read(c1), sum[:m], "allreduce_coalesced, first tensor")
				conformance.ExpectValues(dt, e.Read(c2), sum, "allreduce_coalesced, second tensor")
				o1, o2 := e.Zeros(dt, m), e.Zeros(dt, m)
				w, err = s.PG.ReduceScatterTensorCoalesced(e.Ctx, []*tensor.Tensor{o1, o2}, []*tensor.Tensor{e.Tensor(dt, mine), e.Tensor(dt, mine)},
					backend.ReduceScatterTensorCoalescedOptions{Async: true})
				done("reduce_scatter_tensor_coalesced", w, err)
				conformance.ExpectValues(dt, e.Read(o1), mySum, "reduce_scatter_tensor_coalesced, first output")
				conformance.ExpectValues(dt, e.Read(o2), mySum, "reduce_scatter_tensor_coalesced, second output")

				// Data movement.
				b := e.Tensor(dt, row(s.Rank, m, 2))
				w, err = s.PG.Broadcast(e.Ctx, []*tensor.Tensor{b}, backend.BroadcastOptions{RootRank: root, Async: true})
				done("broadcast", w, err)
				conformance.ExpectValues(dt, e.Read(b), row(root, m, 2), "broadcast")
				in := e.Tensor(dt, row(s.Rank, m, 3))
				big := e.Zeros(dt, m*s.Size)
				w, err = s.PG.AllgatherIntoTensor(e.Ctx, big, in, backend.AllgatherIntoTensorOptions{Async: true})
				done("allgather_into_tensor", w, err)
				gathered := concat(func(r int) []float64 { return row(r, m, 3) })
				conformance.ExpectValues(dt, e.Read(big), gathered, "allgather_into_tensor")
				outs := make([]*tensor.Tensor, s.Size)
				for r := range outs {
					outs[r] = e.Zeros(dt, m)
				}
				w, err = s.PG.Allgather(e.Ctx, [][]*tensor.Tensor{outs}, []*tensor.Tensor{in}, backend.AllgatherOptions{Async: true})
				done("allgather", w, err)
				for r, o := range outs {
					conformance.ExpectValues(dt, e.Read(o), row(r, m, 3), fmt.Sprintf("allgather, block of rank %d", r))
				}
				f1, f2 := e.Zeros(dt, m*s.Size), e.Zeros(dt, m*s.Size)
				w, err = s.PG.AllgatherIntoTensorCoalesced(e.Ctx, []*tensor.Tensor{f1, f2}, []*tensor.Tensor{in, in}, backend.AllgatherIntoTensorCoalescedOptions{Async: true})
				done("allgather_into_tensor_coalesced", w, err)
				conformance.ExpectValues(dt, e.Read(f2), gathered, "allgather_into_tensor_coalesced")
				in2 := e.Tensor(dt, row(s.Rank, m+1, 4))
				lists := [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)}
				for r := range s.Size {
					lists[0][r], lists[1][r] = e.Zeros(dt, m), e.Zeros(dt, m+1)
				}
				w, err = s.PG.AllgatherCoalesced(e.Ctx, lists, []*tensor.Tensor{in, in2}, backend.AllgatherCoalescedOptions{Async: true})
				done("allgather_coalesced", w, err)
				for r := range s.Size {
					conformance.ExpectValues(dt, e.Read(lists[0][r]), row(r, m, 3), "allgather_coalesced, first input")
					conformance.ExpectValues(dt, e.Read(lists[1][r]), row(r, m+1, 4), "allgather_coalesced, second input")
				}
				// Block p of rank r's alltoall input is row(r, m, 10p).
				a2a := e.Tensor(dt, concat(func(p int) []float64 { return row(s.Rank, m, 10*p) }))
				a2aOut := e.Zeros(dt, m*s.Size)
				w, err = s.PG.AlltoallBase(e.Ctx, a2aOut, a2a, backend.AlltoallBaseOptions{Async: true})
				done("alltoall_base", w, err)
				fromAll := concat(func(p int) []float64 { return row(p, m, 10*s.Rank) })
				conformance.ExpectValues(dt, e.Read(a2aOut), fromAll, "alltoall_base")
				ins, outs2 := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
				for p := range s.Size {
					ins[p], outs2[p] = e.Tensor(dt, row(s.Rank, m, 10*p)), e.Zeros(dt, m)
				}
				w, err = s.PG.Alltoall(e.Ctx, outs2, ins, backend.AlltoallOptions{Async: true})
				done("alltoall", w, err)
				for p, o := range outs2 {
					conformance.ExpectValues(dt, e.Read(o), row(p, m, 10*s.Rank), fmt.Sprintf("alltoall, piece from rank %d", p))
				}
				var gl [][]*tensor.Tensor
				if s.Rank == root {
					gl = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						gl[0][r] = e.Zeros(dt, m)
					}
				}
				w, err = s.PG.Gather(e.Ctx, gl, []*tensor.Tensor{in}, backend.GatherOptions{RootRank: root, Async: true})
				done("gather", w, err)
				if s.Rank == root {
					for r, o := range gl[0] {
						conformance.ExpectValues(dt, e.Read(o), row(r, m, 3), fmt.Sprintf("gather, from rank %d", r))
					}
				}
				var sl [][]*tensor.Tensor
				if s.Rank == root {
					sl = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						sl[0][r] = e.Tensor(dt, row(r, m, 5))
					}
				}
				sout := e.Zeros(dt, m)
				w, err = s.PG.Scatter(e.Ctx, []*tensor.Tensor{sout}, sl, backend.ScatterOptions{RootRank: root, Async: true})
				done("scatter", w, err)
				conformance.ExpectValues(dt, e.Read(sout), row(s.Rank, m, 5), "scatter")
				if s.Size > 1 {
					// Around the ring; even ranks send first (a receive
					// posted first would hold the stream behind it).
					next, prev := (s.Rank+1)%s.Size, (s.Rank+s.Size-1)%s.Size
					recv := e.Zeros(dt, m)
					send := func() {
						w, err := s.PG.Send(e.Ctx, []*tensor.Tensor{in}, next, backend.SendOptions{Async: true})
						done("send", w, err)
					}
					if s.Rank%2 == 0 {
						send()
					}
					w, err = s.PG.Recv(e.Ctx, []*tensor.Tensor{recv}, prev, backend.RecvOptions{Async: true})
					done("recv", w, err)
					if s.Rank%2 == 1 {
						send()
					}
					conformance.ExpectValues(dt, e.Read(recv), row(prev, m, 3), "received")
				}
			})
		}

		It("BAND, BOR and BXOR are refused with PyTorch's message", Label(conformance.LabelErrors), func() {
			e := gpu(s)
			defer e.Close()
			x := e.Tensor(tensor.Int32, []float64{1, 2, 3})
			for _, op := range []backend.ReduceOp{backend.BAND, backend.BOR, backend.BXOR} {
				w, err := s.PG.Allreduce(e.Ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op})
				Expect(w).To(BeNil())
				Expect(err).To(MatchError(backend.ErrUnsupported))
				Expect(err.Error()).To(ContainSubstring("Cannot use ReduceOp." + op.String() + " with NCCL"))
			}
		})
	})
}
