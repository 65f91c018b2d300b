package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// bg is the context ops are issued with; ops carry their own timeouts.
var bg = context.Background()

func init() {
	Define(defineErrors)
	Define(defineAsync)
	Define(defineFailures)
	Define(defineShapes)
	Define(defineP2P)
}

// expectArgError asserts an ErrInvalidArgument whose text carries msg
// (PyTorch's wording, reference/peers.md §1.8).
func expectArgError(w backend.Work, err error, msg string) {
	GinkgoHelper()
	Expect(w).To(BeNil())
	Expect(err).To(MatchError(backend.ErrInvalidArgument))
	Expect(err.Error()).To(ContainSubstring(msg))
}

func defineErrors(s *Suite) {
	Describe("argument errors", Label(LabelErrors), func() {
		f := func(n int) *tensor.Tensor { return s.Zeros(tensor.Float32, n) }
		It("rejects an empty tensor list", func() {
			w, err := s.PG.Allreduce(bg, nil, backend.AllreduceOptions{})
			expectArgError(w, err, "requires non-empty tensor list")
		})
		It("rejects an invalid root rank", func() {
			for _, root := range []int{-1, s.Size} {
				w, err := s.PG.Broadcast(bg, []*tensor.Tensor{f(1)}, backend.BroadcastOptions{RootRank: root})
				expectArgError(w, err, "invalid root rank")
				w, err = s.PG.Reduce(bg, []*tensor.Tensor{f(1)}, backend.ReduceOptions{RootRank: root})
				expectArgError(w, err, "invalid root rank")
				w, err = s.PG.Gather(bg, nil, []*tensor.Tensor{f(1)}, backend.GatherOptions{RootRank: root})
				expectArgError(w, err, "invalid root rank")
				w, err = s.PG.Scatter(bg, []*tensor.Tensor{f(1)}, nil, backend.ScatterOptions{RootRank: root})
				expectArgError(w, err, "invalid root rank")
			}
		})
		It("rejects an invalid root tensor", func() {
			w, err := s.PG.Broadcast(bg, []*tensor.Tensor{f(1)}, backend.BroadcastOptions{RootTensor: 1})
			expectArgError(w, err, "invalid root tensor")
		})
		It("rejects mismatched sizes", func() {
			w, err := s.PG.AllgatherIntoTensor(bg, f(s.Size+1), f(1), backend.AllgatherIntoTensorOptions{})
			expectArgError(w, err, "output tensor size must be equal to world_size times input tensor size")
			w, err = s.PG.ReduceScatterTensor(bg, f(1), f(s.Size+1), backend.ReduceScatterTensorOptions{})
			expectArgError(w, err, "input tensor must be the same size as output size times world size")
			w, err = s.PG.Allreduce(bg, []*tensor.Tensor{f(1), f(2)}, backend.AllreduceOptions{})
			expectArgError(w, err, "invalid tensor size")
		})
		It("rejects mismatched dtypes", func() {
			w, err := s.PG.AllgatherIntoTensor(bg, s.Zeros(tensor.Float64, s.Size), f(1), backend.AllgatherIntoTensorOptions{})
			expectArgError(w, err, "output tensor must have the same type as input tensor")
			ins, outs := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
			for i := range ins {
				ins[i], outs[i] = f(1), s.Zeros(tensor.Int32, 1)
			}
			w, err = s.PG.Alltoall(bg, outs, ins, backend.AlltoallOptions{})
			expectArgError(w, err, "tensors with different dtypes")
		})
		It("rejects wrong list sizes", func() {
			w, err := s.PG.Allgather(bg, [][]*tensor.Tensor{{f(1)}}, []*tensor.Tensor{f(1)}, backend.AllgatherOptions{})
			if s.Size != 1 {
				expectArgError(w, err, "Output list size should be the world size")
			} else {
				s.Done(w, err)
			}
			w, err = s.PG.Allgather(bg, nil, []*tensor.Tensor{f(1), f(1)}, backend.AllgatherOptions{})
			expectArgError(w, err, "requires a single-element input tensor list")
		})
		It("rejects non-contiguous tensors", func() {
			t := s.Zeros(tensor.Float32, 8)
			v, err := t.AsStrided([]int{4}, []int{2})
			Expect(err).NotTo(HaveOccurred())
			w, err := s.PG.Allreduce(bg, []*tensor.Tensor{v}, backend.AllreduceOptions{})
			expectArgError(w, err, "Tensors must be contiguous")
		})
		It("rejects bitwise reductions of floating-point tensors", func() {
			for _, op := range []backend.ReduceOp{backend.BAND, backend.BOR, backend.BXOR} {
				w, err := s.PG.Allreduce(bg, []*tensor.Tensor{f(1)}, backend.AllreduceOptions{ReduceOp: op})
				expectArgError(w, err, "Cannot use ReduceOp."+op.String())
			}
		})
		It("rejects bad peers and tags", Label(LabelP2P), func() {
			w, err := s.PG.Send(bg, []*tensor.Tensor{f(1)}, s.Rank, backend.SendOptions{})
			expectArgError(w, err, "invalid destination rank")
			w, err = s.PG.Recv(bg, []*tensor.Tensor{f(1)}, s.Size, backend.RecvOptions{})
			expectArgError(w, err, "invalid source rank")
			w, err = s.PG.Send(bg, []*tensor.Tensor{f(1)}, (s.Rank+1)%s.Size, backend.SendOptions{Tag: -1})
			if s.Size > 1 {
				expectArgError(w, err, "tag must not be negative")
			}
		})
		It("rejects a negative timeout", func() {
			w, err := s.PG.Allreduce(bg, []*tensor.Tensor{f(1)}, backend.AllreduceOptions{Timeout: -time.Second})
			expectArgError(w, err, "timeout must not be negative")
		})
	})
}

func defineAsync(s *Suite) {
	Describe("async semantics", Label(LabelAsync), func() {
		It("returns before a late peer joins, stays incomplete until then, and Wait blocks the host", func() {
			s.Require(s.Size > 1, "needs two ranks")
			ctx, cancel := s.Ctx()
			defer cancel()
			t := s.Tensor(tensor.Float32, []float64{float64(s.Rank + 1)})
			if s.Rank == 0 {
				w, err := s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{})
				Expect(err).NotTo(HaveOccurred())
				Consistently(w.IsCompleted, 200*time.Millisecond, 20*time.Millisecond).Should(BeFalse())
				Expect(s.store.Set(ctx, fmt.Sprintf("late/%d", s.specN), []byte("go"))).To(Succeed())
				if !s.Caps.StreamSemantics {
					Expect(w.Wait(ctx)).To(Succeed())
					Expect(w.IsCompleted()).To(BeTrue(), "Wait returned before the op completed")
				} else {
					Expect(w.WaitHost(ctx)).To(Succeed())
				}
			} else {
				Expect(s.store.Wait(ctx, fmt.Sprintf("late/%d", s.specN))).To(Succeed())
				s.Done(s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{}))
			}
			Expect(s.Values(t)).To(Equal([]float64{float64(s.Size * (s.Size + 1) / 2)}))
		})
		It("a barrier completes only after every earlier work", func() {
			var works []backend.Work
			var ts []*tensor.Tensor
			for i := range 20 {
				t := s.Tensor(tensor.Float32, []float64{float64(i), float64(s.Rank)})
				w, err := s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{})
				Expect(err).NotTo(HaveOccurred())
				works, ts = append(works, w), append(ts, t)
			}
			s.Done(s.PG.Barrier(bg, backend.BarrierOptions{}))
			for i, w := range works {
				Expect(w.IsCompleted()).To(BeTrue(), "work %d not complete after the barrier", i)
				Expect(s.Values(ts[i])).To(Equal([]float64{float64(i * s.Size), float64(s.Size * (s.Size - 1) / 2)}))
			}
		})
		It("the blocking forms return each op done, between async ones", func() {
			ctx, cancel := s.Ctx()
			defer cancel()
			var works []backend.Work
			var ts []*tensor.Tensor
			want := func(i int) []float64 { return []float64{float64(i * s.Size), float64(s.Size * (s.Size - 1) / 2)} }
			for i := range 200 {
				t := s.Tensor(tensor.Float32, []float64{float64(i), float64(s.Rank)})
				if i%10 == 3 { // an async op, waited for at the end
					w, err := s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{})
					Expect(err).NotTo(HaveOccurred())
					works, ts = append(works, w), append(ts, t)
					continue
				}
				Expect(s.PG.AllreduceWait(ctx, []*tensor.Tensor{t}, backend.AllreduceOptions{})).To(Succeed(), "op %d", i)
				Expect(s.Values(t)).To(Equal(want(i)), "op %d", i)
			}
			Expect(s.PG.BarrierWait(ctx, backend.BarrierOptions{})).To(Succeed())
			for k, w := range works {
				Expect(w.Wait(ctx)).To(Succeed())
				Expect(s.Values(ts[k])).To(Equal(want(10*k+3)), "async op %d", 10*k+3)
			}
			b := s.Tensor(tensor.Int64, []float64{float64(s.Rank)})
			Expect(s.PG.BroadcastWait(ctx, []*tensor.Tensor{b}, backend.BroadcastOptions{RootRank: s.Size - 1})).To(Succeed())
			Expect(s.Values(b)).To(Equal([]float64{float64(s.Size - 1)}))
			err := s.PG.AllreduceWait(ctx, nil, backend.AllreduceOptions{})
			Expect(err).To(MatchError(backend.ErrInvalidArgument))
			Expect(err.Error()).To(ContainSubstring("requires non-empty tensor list"))
		})
		It("1000 ops in flight come back correct and in order", Label(LabelStress), func() {
			const n = 1000
			type op struct {
				w   backend.Work
				t   []*tensor.Tensor
				chk func()
			}
			ops := make([]op, 0, n)
			root := s.Size - 1
			for i := range n {
				var o op
				var err error
				switch i % 4 {
				case 0:
					t := s.Tensor(tensor.Float32, []float64{float64(i), float64(s.Rank)})
					o.w, err = s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{})
					o.chk = func() {
						Expect(s.Values(t)).To(Equal([]float64{float64(i * s.Size), float64(s.Size * (s.Size - 1) / 2)}), "allreduce %d", i)
					}
				case 1:
					t := s.Tensor(tensor.Int64, []float64{float64(i + s.Rank)})
					o.w, err = s.PG.Broadcast(bg, []*tensor.Tensor{t}, backend.BroadcastOptions{RootRank: i % s.Size})
					o.chk = func() { Expect(s.Values(t)).To(Equal([]float64{float64(i + i%s.Size)}), "broadcast %d", i) }
				case 2:
					out := s.Zeros(tensor.Int32, s.Size)
					o.w, err = s.PG.AllgatherIntoTensor(bg, out, s.Tensor(tensor.Int32, []float64{float64(i*10 + s.Rank)}), backend.AllgatherIntoTensorOptions{})
					o.chk = func() {
						v := s.Values(out)
						for r := range s.Size {
							Expect(v[r]).To(Equal(float64(i*10+r)), "allgather %d", i)
						}
					}
				case 3:
					t := s.Tensor(tensor.Float64, []float64{float64(i)})
					o.w, err = s.PG.Reduce(bg, []*tensor.Tensor{t}, backend.ReduceOptions{RootRank: root, ReduceOp: backend.MAX})
					o.chk = func() {
						if s.Rank == root {
							Expect(s.Values(t)).To(Equal([]float64{float64(i)}), "reduce %d", i)
						}
					}
				}
				Expect(err).NotTo(HaveOccurred())
				ops = append(ops, o)
			}
			ctx, cancel := s.Ctx()
			defer cancel()
			for i, o := range ops {
				Expect(o.w.Wait(ctx)).To(Succeed(), "op %d", i)
				o.chk()
			}
		})
		It("works report completion, timing and their future", Label(LabelLifetime), func() {
			t := s.Tensor(tensor.Float32, []float64{1})
			w, err := s.PG.Allreduce(bg, []*tensor.Tensor{t}, backend.AllreduceOptions{})
			s.Done(w, err)
			Expect(w.IsCompleted()).To(BeTrue())
			Expect(w.Exception()).To(Succeed())
			vals, err := w.Future().Value()
			Expect(err).NotTo(HaveOccurred())
			if len(vals) > 0 {
				Expect(s.Values(vals[0])).To(Equal([]float64{float64(s.Size)}))
			}
			if s.Caps.Timing {
				if d, err := w.Duration(); err == nil {
					Expect(d).To(BeNumerically(">=", 0))
				}
			}
		})
	})
}

// freshGroup makes a group for a spec that breaks it, and closes it after.
func freshGroup(s *Suite, timeout time.Duration) *dispatcher.ProcessGroup {
	GinkgoHelper()
	ctx, cancel := s.Ctx()
	defer cancel()
	g, err := s.NewGroup(ctx, timeout)
	Expect(err).NotTo(HaveOccurred())
	// Aborted before the suite's AfterEach may make a new group: kernels of
	// g still waiting on a peer would hold the device's default stream.
	s.OnSpecEnd(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Abort(ctx, errors.New("conformance: spec over"))
	})
	return g
}

func opErr(err error) *backend.OpError {
	GinkgoHelper()
	var oe *backend.OpError
	Expect(errors.As(err, &oe)).To(BeTrue(), "want a *backend.OpError, got %T: %v", err, err)
	return oe
}

func defineFailures(s *Suite) {
	Describe("failures", Label(LabelTimeout), func() {
		// A rank that never joins a collective is the child-process spec
		// "a rank that skips a collective ..." (spec_failures.go): on a GPU
		// its peer's kernel never finishes, which no in-process spec can
		// clean up after.
		It("fails with ErrRemote naming a dead peer, not a hang", Label(LabelLifetime), func() {
			s.Gate("lifetime/peer-death")
			s.Require(s.Size > 1, "needs two ranks")
			s.Require(!s.onStreams(), "on GPUs this is the child-process spec \"a killed peer is detected ...\": "+
				"the kernel that waits for the dead peer would outlive the spec in this process")
			g := freshGroup(s, time.Minute)
			dead := s.Size - 1
			var w backend.Work
			if s.Rank != dead {
				var err error
				w, err = g.Allreduce(bg, []*tensor.Tensor{s.Zeros(tensor.Float32, 1024)}, backend.AllreduceOptions{})
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(s.Sync()).To(Succeed())
			if s.Rank == dead {
				// The peer's end of the connections goes away as in a crash.
				Expect(g.Abort(bg, errors.New("conformance: simulated crash"))).To(Succeed())
			} else {
				ctx, cancel := context.WithTimeout(bg, 10*time.Second)
				defer cancel()
				err := w.WaitHost(ctx)
				Expect(ctx.Err()).To(Succeed(), "hung after the peer died")
				Expect(err).To(MatchError(backend.ErrRemote))
				Expect(opErr(err).Ranks).NotTo(BeEmpty())
			}
			Expect(s.Sync()).To(Succeed())
		})
		// Abort of a group with a pending work is the child-process spec
		// "Abort fails the pending work ..." (spec_failures.go): on a GPU
		// the aborted kernel may outlive the group in this process.
		It("monitored_barrier passes, and names the ranks that do not arrive", Label(LabelLifetime), func() {
			if _, err := s.PG.Backend(tensor.CPU); err != nil {
				Skip(fmt.Sprintf("monitored_barrier is host-only, as in PyTorch, and backend %q serves no CPU tensors", s.Backend))
			}
			w, err := s.PG.MonitoredBarrier(bg, backend.MonitoredBarrierOptions{Timeout: 10 * time.Second})
			s.SkipUnsupported(err)
			s.Done(w, err)
			if s.Size < 2 {
				return
			}
			g := freshGroup(s, 20*time.Second)
			late := s.Size - 1
			if s.Rank != late {
				w, err := g.MonitoredBarrier(bg, backend.MonitoredBarrierOptions{Timeout: 500 * time.Millisecond, WaitAllRanks: true})
				Expect(err).NotTo(HaveOccurred())
				ctx, cancel := s.Ctx()
				defer cancel()
				err = w.WaitHost(ctx)
				Expect(err).To(HaveOccurred())
				if s.Rank == 0 {
					Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("Rank %d failed to pass monitoredBarrier", late)))
					Expect(opErr(err).Ranks).To(Equal([]int{late}))
				} else {
					Expect(err.Error()).To(ContainSubstring("check rank 0 logs"))
				}
			}
			Expect(s.Sync()).To(Succeed())
		})
	})
}

func defineShapes(s *Suite) {
	Describe("empty and uneven tensors", Label(LabelOps), func() {
		It("every collective accepts empty tensors", func() {
			e := func() *tensor.Tensor { return s.Zeros(tensor.Float32, 0) }
			s.Done(s.PG.Allreduce(bg, []*tensor.Tensor{e()}, backend.AllreduceOptions{}))
			s.Done(s.PG.Broadcast(bg, []*tensor.Tensor{e()}, backend.BroadcastOptions{}))
			s.Done(s.PG.Reduce(bg, []*tensor.Tensor{e()}, backend.ReduceOptions{}))
			s.Done(s.PG.AllgatherIntoTensor(bg, e(), e(), backend.AllgatherIntoTensorOptions{}))
			s.Done(s.PG.ReduceScatterTensor(bg, e(), e(), backend.ReduceScatterTensorOptions{}))
			outs, ins := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
			for i := range outs {
				outs[i], ins[i] = e(), e()
			}
			s.Done(s.PG.Allgather(bg, [][]*tensor.Tensor{outs}, []*tensor.Tensor{e()}, backend.AllgatherOptions{}))
			s.Done(s.PG.Alltoall(bg, outs, ins, backend.AlltoallOptions{}))
			s.Done(s.PG.AlltoallBase(bg, e(), e(), backend.AlltoallBaseOptions{}))
			var gl [][]*tensor.Tensor
			if s.Rank == 0 {
				gl = [][]*tensor.Tensor{outs}
			}
			s.Done(s.PG.Gather(bg, gl, []*tensor.Tensor{e()}, backend.GatherOptions{}))
			s.Done(s.PG.Scatter(bg, []*tensor.Tensor{e()}, gl, backend.ScatterOptions{}))
			s.Done(s.PG.Barrier(bg, backend.BarrierOptions{}))
		})
		It("allgather and reduce_scatter take uneven sizes", func() {
			s.Require(s.Caps.UnevenSizes, s.Backend+" has no uneven allgather/reduce_scatter")
			size := func(r int) int { return r%3 + 1 }
			outs := make([]*tensor.Tensor, s.Size)
			for r := range outs {
				outs[r] = s.Zeros(tensor.Float32, size(r))
			}
			mine := make([]float64, size(s.Rank))
			for i := range mine {
				mine[i] = float64(10*s.Rank + i)
			}
			s.Done(s.PG.Allgather(bg, [][]*tensor.Tensor{outs}, []*tensor.Tensor{s.Tensor(tensor.Float32, mine)}, backend.AllgatherOptions{}))
			for r := range s.Size {
				v := s.Values(outs[r])
				for i := range v {
					Expect(v[i]).To(Equal(float64(10*r + i)))
				}
			}
			ins := make([]*tensor.Tensor, s.Size)
			for r := range ins {
				v := make([]float64, size(r))
				for i := range v {
					v[i] = float64(s.Rank + i)
				}
				ins[r] = s.Tensor(tensor.Float32, v)
			}
			out := s.Zeros(tensor.Float32, size(s.Rank))
			s.Done(s.PG.ReduceScatter(bg, []*tensor.Tensor{out}, [][]*tensor.Tensor{ins}, backend.ReduceScatterOptions{}))
			v := s.Values(out)
			for i := range v {
				Expect(v[i]).To(Equal(float64(s.Size*(s.Size-1)/2 + s.Size*i)))
			}
		})
		It("alltoall takes uneven pieces and alltoall_base split sizes", func() {
			// Rank r sends r+p+1 rows to rank p.
			ins, outs := make([]*tensor.Tensor, s.Size), make([]*tensor.Tensor, s.Size)
			var flat []float64
			inSplits, outSplits := make([]int, s.Size), make([]int, s.Size)
			total := 0
			for p := range s.Size {
				v := make([]float64, s.Rank+p+1)
				for i := range v {
					v[i] = float64(100*s.Rank + p)
				}
				ins[p], outs[p] = s.Tensor(tensor.Int32, v), s.Zeros(tensor.Int32, p+s.Rank+1)
				flat = append(flat, v...)
				inSplits[p], outSplits[p] = s.Rank+p+1, p+s.Rank+1
				total += p + s.Rank + 1
			}
			s.Done(s.PG.Alltoall(bg, outs, ins, backend.AlltoallOptions{}))
			for p := range s.Size {
				for _, x := range s.Values(outs[p]) {
					Expect(x).To(Equal(float64(100*p + s.Rank)))
				}
			}
			out := s.Zeros(tensor.Int32, total)
			s.Done(s.PG.AlltoallBase(bg, out, s.Tensor(tensor.Int32, flat), backend.AlltoallBaseOptions{InputSplitSizes: inSplits, OutputSplitSizes: outSplits}))
			v, off := s.Values(out), 0
			for p := range s.Size {
				for range outSplits[p] {
					Expect(v[off]).To(Equal(float64(100*p + s.Rank)))
					off++
				}
			}
		})
	})
}

func defineP2P(s *Suite) {
	Describe("point to point", Label(LabelP2P), func() {
		It("matches sends and receives by user tag", func() {
			s.Gate("p2p/tags")
			s.Require(s.Size > 1, "needs two ranks")
			if s.Rank == 0 {
				s.Done(s.Issued(s.PG.Send(bg, []*tensor.Tensor{s.Tensor(tensor.Int64, []float64{1})}, 1, backend.SendOptions{Tag: 1})))
				s.Done(s.PG.Send(bg, []*tensor.Tensor{s.Tensor(tensor.Int64, []float64{2})}, 1, backend.SendOptions{Tag: 2}))
			} else if s.Rank == 1 {
				two, one := s.Zeros(tensor.Int64, 1), s.Zeros(tensor.Int64, 1)
				w2, err := s.Issued(s.PG.Recv(bg, []*tensor.Tensor{two}, 0, backend.RecvOptions{Tag: 2}))
				Expect(err).NotTo(HaveOccurred())
				s.Done(s.PG.Recv(bg, []*tensor.Tensor{one}, 0, backend.RecvOptions{Tag: 1}))
				s.Done(w2, nil)
				Expect(s.Values(one)).To(Equal([]float64{1}))
				Expect(s.Values(two)).To(Equal([]float64{2}))
			}
		})
		It("recv_anysource names the sender", func() {
			s.Require(s.Size > 1, "needs two ranks")
			last := s.Size - 1
			switch s.Rank {
			case 0:
				t := s.Zeros(tensor.Float32, 3)
				w, err := s.PG.RecvAnysource(bg, []*tensor.Tensor{t}, backend.RecvAnysourceOptions{Tag: 5})
				s.SkipUnsupported(err)
				s.Done(w, err)
				sr, ok := w.(backend.SourceRanker)
				Expect(ok).To(BeTrue(), "the work of recv_anysource implements backend.SourceRanker")
				Expect(sr.SourceRank()).To(Equal(last))
				Expect(s.Values(t)).To(Equal([]float64{7, 8, 9}))
			case last:
				if s.Caps.StreamSemantics {
					Skip("stream backends have no recv_anysource")
				}
				s.Done(s.Issued(s.PG.Send(bg, []*tensor.Tensor{s.Tensor(tensor.Float32, []float64{7, 8, 9})}, 0, backend.SendOptions{Tag: 5})))
			}
		})
	})
}
