package conformance

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// Every op, every dtype the backend moves, every reduce op valid for the
// dtype, against a reference computed here from the inputs of all ranks
// (each rank can compute every rank's input: they are a formula).

func init() { Define(defineReductions); Define(defineMovement) }

// Inputs returns this rank's input and every rank's, for count elements
// of Input from position salt on.
func (s *Suite) Inputs(dt tensor.DType, op backend.RedOpType, count, salt int) (mine []float64, all [][]float64) {
	all = make([][]float64, s.Size)
	for r := range all {
		all[r] = make([]float64, count)
		for i := range all[r] {
			all[r][i] = Input(dt, op, r, i+salt)
		}
	}
	return all[s.Rank], all
}

// RequireDType skips the spec unless the backend supports dt.
func (s *Suite) RequireDType(dt tensor.DType) {
	s.Require(s.Caps.SupportsDType(dt), fmt.Sprintf("%s does not support %s", s.Backend, dt))
}

func defineReductions(s *Suite) {
	Describe("reductions", Label(LabelOps, LabelDTypes), func() {
		for _, dt := range tensor.DTypes() {
			for _, op := range ReduceOps(dt) {
				name := fmt.Sprintf("%s %s", dt, op)
				setup := func() {
					s.RequireDType(dt)
					s.Gate("reduce/" + dt.String() + "/" + op.Type.String())
					if op.Bitwise() {
						s.Require(s.Caps.BitwiseReductions, s.Backend+" has no bitwise reductions")
					}
				}
				It("allreduce "+name, func() {
					setup()
					for _, count := range []int{7, 1} {
						mine, all := s.Inputs(dt, op.Type, count, 0)
						t := s.Tensor(dt, mine)
						s.Done(s.Issued(s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{ReduceOp: op})))
						ExpectValues(dt, s.Values(t), Reference(dt, op, all), "allreduce")
					}
				})
				It("reduce "+name, func() {
					setup()
					root := s.Size - 1
					mine, all := s.Inputs(dt, op.Type, 9, 1)
					t := s.Tensor(dt, mine)
					s.Done(s.Issued(s.PG.Reduce(bg, []*tensor.Tensor{t}, backend.ReduceOptions{RootRank: root, ReduceOp: op})))
					if s.Rank == root {
						ExpectValues(dt, s.Values(t), Reference(dt, op, all), "reduce on the root")
					}
				})
				It("reduce_scatter_tensor "+name, func() {
					setup()
					const c = 3
					mine, all := s.Inputs(dt, op.Type, c*s.Size, 2)
					in, out := s.Tensor(dt, mine), s.Zeros(dt, c)
					s.Done(s.Issued(s.PG.ReduceScatterTensor(bg, out, in, backend.ReduceScatterTensorOptions{ReduceOp: op})))
					ExpectValues(dt, s.Values(out), Reference(dt, op, all)[s.Rank*c:(s.Rank+1)*c], "reduce_scatter_tensor")
				})
				It("reduce_scatter "+name, func() {
					setup()
					const c = 2
					mine, all := s.Inputs(dt, op.Type, c*s.Size, 3)
					list := make([]*tensor.Tensor, s.Size)
					for r := range list {
						list[r] = s.Tensor(dt, mine[r*c:(r+1)*c])
					}
					out := s.Zeros(dt, c)
					err := func() error {
						w, err := s.PG.ReduceScatter(bg, []*tensor.Tensor{out}, [][]*tensor.Tensor{list}, backend.ReduceScatterOptions{ReduceOp: op})
						s.SkipUnsupported(err)
						s.Done(w, err)
						return nil
					}()
					Expect(err).NotTo(HaveOccurred())
					ExpectValues(dt, s.Values(out), Reference(dt, op, all)[s.Rank*c:(s.Rank+1)*c], "reduce_scatter")
				})
				It("allreduce_coalesced "+name, func() {
					setup()
					a, allA := s.Inputs(dt, op.Type, 4, 4)
					b, allB := s.Inputs(dt, op.Type, 6, 5)
					ta, tb := s.Tensor(dt, a), s.Tensor(dt, b)
					w, err := s.PG.AllreduceCoalesced(bg, []*tensor.Tensor{ta, tb}, backend.AllreduceCoalescedOptions{ReduceOp: op})
					s.SkipUnsupported(err)
					s.Done(w, err)
					ExpectValues(dt, s.Values(ta), Reference(dt, op, allA), "first tensor")
					ExpectValues(dt, s.Values(tb), Reference(dt, op, allB), "second tensor")
				})
				It("reduce_scatter_tensor_coalesced "+name, func() {
					setup()
					a, allA := s.Inputs(dt, op.Type, 2*s.Size, 6)
					b, allB := s.Inputs(dt, op.Type, 3*s.Size, 7)
					oa, ob := s.Zeros(dt, 2), s.Zeros(dt, 3)
					w, err := s.PG.ReduceScatterTensorCoalesced(bg, []*tensor.Tensor{oa, ob}, []*tensor.Tensor{s.Tensor(dt, a), s.Tensor(dt, b)}, backend.ReduceScatterTensorCoalescedOptions{ReduceOp: op})
					s.SkipUnsupported(err)
					s.Done(w, err)
					ExpectValues(dt, s.Values(oa), Reference(dt, op, allA)[s.Rank*2:(s.Rank+1)*2], "first output")
					ExpectValues(dt, s.Values(ob), Reference(dt, op, allB)[s.Rank*3:(s.Rank+1)*3], "second output")
				})
			}
		}
		// Large buffers take the bandwidth algorithms (ring, segments).
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int64} {
			for _, op := range []backend.ReduceOp{backend.SUM, backend.MAX} {
				It(fmt.Sprintf("allreduce and reduce_scatter_tensor of a large %s buffer, %s", dt, op), func() {
					s.RequireDType(dt)
					count := 150_001 * s.Size
					mine, all := s.Inputs(dt, op.Type, count, 0)
					t := s.Tensor(dt, mine)
					s.Done(s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{ReduceOp: op}))
					want := Reference(dt, op, all)
					ExpectValues(dt, s.Values(t), want, "large allreduce")
					c := count / s.Size
					out := s.Zeros(dt, c)
					s.Done(s.PG.ReduceScatterTensor(bg, out, s.Tensor(dt, mine), backend.ReduceScatterTensorOptions{ReduceOp: op}))
					ExpectValues(dt, s.Values(out), want[s.Rank*c:(s.Rank+1)*c], "large reduce_scatter_tensor")
				})
			}
		}
	})
}

func defineMovement(s *Suite) {
	Describe("data movement", Label(LabelOps, LabelDTypes), func() {
		for _, dt := range tensor.DTypes() {
			val := func(r, i int) float64 { return Input(dt, backend.Sum, r, i) }
			row := func(r, n, salt int) []float64 {
				v := make([]float64, n)
				for i := range v {
					v[i] = val(r, i+salt)
				}
				return v
			}
			It("broadcast "+dt.String(), func() {
				s.RequireDType(dt)
				root := s.Size - 1
				t := s.Tensor(dt, row(s.Rank, 11, 0))
				s.Done(s.PG.Broadcast(bg, []*tensor.Tensor{t}, backend.BroadcastOptions{RootRank: root}))
				ExpectValues(dt, s.Values(t), row(root, 11, 0), "broadcast")
			})
			It("allgather "+dt.String(), func() {
				s.RequireDType(dt)
				outs := make([]*tensor.Tensor, s.Size)
				for r := range outs {
					outs[r] = s.Zeros(dt, 5)
				}
				s.Done(s.PG.Allgather(bg, [][]*tensor.Tensor{outs}, []*tensor.Tensor{s.Tensor(dt, row(s.Rank, 5, 1))}, backend.AllgatherOptions{}))
				for r, o := range outs {
					ExpectValues(dt, s.Values(o), row(r, 5, 1), fmt.Sprintf("block of rank %d", r))
				}
			})
			It("allgather_into_tensor "+dt.String(), func() {
				s.RequireDType(dt)
				out := s.Zeros(dt, 4*s.Size)
				s.Done(s.PG.AllgatherIntoTensor(bg, out, s.Tensor(dt, row(s.Rank, 4, 2)), backend.AllgatherIntoTensorOptions{}))
				var want []float64
				for r := range s.Size {
					want = append(want, row(r, 4, 2)...)
				}
				ExpectValues(dt, s.Values(out), want, "allgather_into_tensor")
			})
			It("allgather_coalesced and allgather_into_tensor_coalesced "+dt.String(), func() {
				s.RequireDType(dt)
				outs := [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)}
				for r := range s.Size {
					outs[0][r], outs[1][r] = s.Zeros(dt, 2), s.Zeros(dt, 3)
				}
				ins := []*tensor.Tensor{s.Tensor(dt, row(s.Rank, 2, 3)), s.Tensor(dt, row(s.Rank, 3, 4))}
				w, err := s.PG.AllgatherCoalesced(bg, outs, ins, backend.AllgatherCoalescedOptions{})
				s.SkipUnsupported(err)
				s.Done(w, err)
				for r := range s.Size {
					ExpectValues(dt, s.Values(outs[0][r]), row(r, 2, 3), "first input")
					ExpectValues(dt, s.Values(outs[1][r]), row(r, 3, 4), "second input")
				}
				flat := []*tensor.Tensor{s.Zeros(dt, 2*s.Size), s.Zeros(dt, 3*s.Size)}
				w, err = s.PG.AllgatherIntoTensorCoalesced(bg, flat, ins, backend.AllgatherIntoTensorCoalescedOptions{})
				s.SkipUnsupported(err)
				s.Done(w, err)
				var wa, wb []float64
				for r := range s.Size {
					wa, wb = append(wa, row(r, 2, 3)...), append(wb, row(r, 3, 4)...)
				}
				ExpectValues(dt, s.Values(flat[0]), wa, "first output")
				ExpectValues(dt, s.Values(flat[1]), wb, "second output")
			})
			It("alltoall and alltoall_base "+dt.String(), func() {
				s.RequireDType(dt)
				ins, outs := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
				var flatIn []float64
				for p := range s.Size {
					ins[p] = s.Tensor(dt, row(s.Rank, 3, 10*p))
					outs[p] = s.Zeros(dt, 3)
					flatIn = append(flatIn, row(s.Rank, 3, 10*p)...)
				}
				s.Done(s.PG.Alltoall(bg, outs, ins, backend.AlltoallOptions{}))
				var want []float64
				for p := range s.Size {
					ExpectValues(dt, s.Values(outs[p]), row(p, 3, 10*s.Rank), fmt.Sprintf("piece from rank %d", p))
					want = append(want, row(p, 3, 10*s.Rank)...)
				}
				out := s.Zeros(dt, 3*s.Size)
				s.Done(s.PG.AlltoallBase(bg, out, s.Tensor(dt, flatIn), backend.AlltoallBaseOptions{}))
				ExpectValues(dt, s.Values(out), want, "alltoall_base")
			})
			It("gather and scatter "+dt.String(), func() {
				s.RequireDType(dt)
				root := s.Size - 1
				var outs [][]*tensor.Tensor
				if s.Rank == root {
					outs = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						outs[0][r] = s.Zeros(dt, 3)
					}
				}
				s.Done(s.PG.Gather(bg, outs, []*tensor.Tensor{s.Tensor(dt, row(s.Rank, 3, 5))}, backend.GatherOptions{RootRank: root}))
				if s.Rank == root {
					for r := range s.Size {
						ExpectValues(dt, s.Values(outs[0][r]), row(r, 3, 5), fmt.Sprintf("gathered from rank %d", r))
					}
				}
				var ins [][]*tensor.Tensor
				if s.Rank == root {
					ins = [][]*tensor.Tensor{make([]*tensor.Tensor, s.Size)}
					for r := range s.Size {
						ins[0][r] = s.Tensor(dt, row(r, 4, 6))
					}
				}
				out := s.Zeros(dt, 4)
				s.Done(s.PG.Scatter(bg, []*tensor.Tensor{out}, ins, backend.ScatterOptions{RootRank: root}))
				ExpectValues(dt, s.Values(out), row(s.Rank, 4, 6), "scattered")
			})
			It("send and recv around the ring "+dt.String(), Label(LabelP2P), func() {
				s.RequireDType(dt)
				s.Require(s.Size > 1, "needs two ranks")
				next, prev := (s.Rank+1)%s.Size, (s.Rank+s.Size-1)%s.Size
				in, out := s.Zeros(dt, 6), s.Tensor(dt, row(s.Rank, 6, 7))
				var rw backend.Work
				if s.Caps.StreamSemantics && s.Rank%2 == 0 {
					// On a stream backend a receive posted first would hold
					// the stream, and the send queued behind it, until the
					// peer's send came: even ranks send first.
					s.Done(s.Issued(s.PG.Send(bg, []*tensor.Tensor{out}, next, backend.SendOptions{})))
					var err error
					rw, err = s.PG.Recv(bg, []*tensor.Tensor{in}, prev, backend.RecvOptions{})
					s.Done(rw, err)
				} else {
					var err error
					rw, err = s.Issued(s.PG.Recv(bg, []*tensor.Tensor{in}, prev, backend.RecvOptions{}))
					Expect(err).NotTo(HaveOccurred())
					s.Done(s.PG.Send(bg, []*tensor.Tensor{out}, next, backend.SendOptions{}))
					s.Done(rw, nil)
				}
				Expect(rw.IsCompleted()).To(BeTrue())
				ExpectValues(dt, s.Values(in), row(prev, 6, 7), "received")
			})
		}
	})
}
