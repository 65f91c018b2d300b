package nccl

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// val is rank r's element i: small integers, exact in every dtype
// (float8_e5m2 included) and in their sums over two ranks.
func val(dt tensor.DType, r, i int) float64 {
	if dt == tensor.Bool {
		return float64((r + i) % 2)
	}
	return float64((r+i)%3 + 1)
}

func reduceRef(dt tensor.DType, op backend.ReduceOp, world, i int) float64 {
	acc := val(dt, 0, i)
	for r := 1; r < world; r++ {
		v := val(dt, r, i)
		switch op.Type {
		case backend.Sum, backend.Avg, backend.PreMulSum:
			acc += v
		case backend.Product:
			acc *= v
		case backend.Max:
			acc = max(acc, v)
		case backend.Min:
			acc = min(acc, v)
		}
	}
	if dt == tensor.Bool {
		if acc != 0 {
			return 1
		}
		return 0
	}
	switch op.Type {
	case backend.Avg:
		acc /= float64(world)
		if !dt.IsFloat() {
			acc = float64(int64(acc))
		}
	case backend.PreMulSum:
		acc *= op.Factor
	}
	return acc
}

// TestEveryOpEveryDType runs each op NCCL can do with each dtype over all
// the GPUs, in sync and async mode alternately, and checks every element.
func TestEveryOpEveryDType(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	world := len(envs)
	const m = 6 // elements per rank block
	for _, dt := range envs[0].b.Capabilities().DTypes {
		t.Run(dt.String(), func(t *testing.T) {
			async := false
			step := func() bool { async = !async; return async }
			ops := []backend.ReduceOp{backend.SUM, backend.PRODUCT, backend.MAX, backend.MIN}
			if dt != tensor.Bool {
				ops = append(ops, backend.AVG)
			}
			if dt.IsFloat() && !(world == 1 && (dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2)) {
				ops = append(ops, backend.PremulSum(2)) // one-rank float8 PREMUL_SUM: ErrUnsupported (NCCL)
			}
			each(t, envs, func(e *rankEnv) error {
				mk := func(k int, f func(i int) float64) *tensor.Tensor {
					x, err := e.fill(dt, k, f)
					if err != nil {
						panic(err)
					}
					return x
				}
				mine := func(i int) float64 { return val(dt, e.r, i) }
				zeros := func(k int) *tensor.Tensor {
					x, err := cuda.Zeros(e.ctx, e.r, dt, k)
					if err != nil {
						panic(err)
					}
					return x
				}
				run := func(name string, w backend.Work, err error, out *tensor.Tensor, want func(i int) float64) error {
					if err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					if w != nil {
						if err := w.Wait(e.ctx); err != nil {
							return fmt.Errorf("%s: wait: %w", name, err)
						}
					}
					if out == nil {
						return nil
					}
					got, err := e.read(out)
					if err != nil {
						return err
					}
					if err := expect(got, want); err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					return nil
				}
				as := step()
				// allreduce with every reduce op
				for _, op := range ops {
					x := mk(m, mine)
					w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op, Async: as})
					if err := run("allreduce "+op.String(), w, err, x, func(i int) float64 { return reduceRef(dt, op, world, i) }); err != nil {
						return err
					}
					x.Free()
				}
				// broadcast from the last rank
				root := world - 1
				x := mk(m, mine)
				w, err := e.b.Broadcast(e.ctx, e.meta(backend.OpBroadcast), []*tensor.Tensor{x}, backend.BroadcastOptions{RootRank: root, Async: as})
				if err := run("broadcast", w, err, x, func(i int) float64 { return val(dt, root, i) }); err != nil {
					return err
				}
				// reduce to rank 0
				y := mk(m, mine)
				w, err = e.b.Reduce(e.ctx, e.meta(backend.OpReduce), []*tensor.Tensor{y}, backend.ReduceOptions{Async: as})
				var out *tensor.Tensor
				if e.r == 0 {
					out = y
				}
				if err := run("reduce", w, err, out, func(i int) float64 { return reduceRef(dt, backend.SUM, world, i) }); err != nil {
					return err
				}
				// allgather_into_tensor and allgather (list)
				in := mk(m, mine)
				big := zeros(m * world)
				w, err = e.b.AllgatherIntoTensor(e.ctx, e.meta(backend.OpAllgatherIntoTensor), big, in, backend.AllgatherIntoTensorOptions{Async: as})
				gathered := func(i int) float64 { return val(dt, i/m, i%m) }
				if err := run("allgather_into_tensor", w, err, big, gathered); err != nil {
					return err
				}
				outs := make([]*tensor.Tensor, world)
				for r := range outs {
					outs[r] = zeros(m)
				}
				w, err = e.b.Allgather(e.ctx, e.meta(backend.OpAllgather), [][]*tensor.Tensor{outs}, []*tensor.Tensor{in}, backend.AllgatherOptions{Async: as})
				if err := run("allgather", w, err, nil, nil); err != nil {
					return err
				}
				for r, o := range outs {
					if err := run(fmt.Sprintf("allgather[%d]", r), nil, nil, o, func(i int) float64 { return val(dt, r, i) }); err != nil {
						return err
					}
				}
				// reduce_scatter_tensor and reduce_scatter (list)
				src := mk(m*world, mine)
				dst := zeros(m)
				w, err = e.b.ReduceScatterTensor(e.ctx, e.meta(backend.OpReduceScatterTensor), dst, src, backend.ReduceScatterTensorOptions{Async: as})
				scattered := func(i int) float64 { return reduceRef(dt, backend.SUM, world, e.r*m+i) }
				if err := run("reduce_scatter_tensor", w, err, dst, scattered); err != nil {
					return err
				}
				blocks := make([]*tensor.Tensor, world)
				for r := range blocks {
					blocks[r] = mk(m, func(i int) float64 { return val(dt, e.r, r*m+i) })
				}
				dst2 := zeros(m)
				w, err = e.b.ReduceScatter(e.ctx, e.meta(backend.OpReduceScatter), []*tensor.Tensor{dst2}, [][]*tensor.Tensor{blocks}, backend.ReduceScatterOptions{Async: as})
				if err := run("reduce_scatter", w, err, dst2, scattered); err != nil {
					return err
				}
				// alltoall_base (equal and uneven) and alltoall (list)
				a2aIn := mk(m*world, func(i int) float64 { return val(dt, e.r, i) })
				a2aOut := zeros(m * world)
				w, err = e.b.AlltoallBase(e.ctx, e.meta(backend.OpAlltoallBase), a2aOut, a2aIn, backend.AlltoallBaseOptions{Async: as})
				// block r of my output is block e.r of rank r's input
				if err := run("alltoall_base", w, err, a2aOut, func(i int) float64 { return val(dt, i/m, e.r*m+i%m) }); err != nil {
					return err
				}
				if world == 2 {
					// rank r sends r+1 rows to rank 0 and 2-r... keep it simple: 1/2 split both ways
					a2 := mk(3, func(i int) float64 { return val(dt, e.r, i) })
					o2 := zeros(3)
					inS := []int{1, 2}
					outS := []int{1, 1}
					if e.r == 1 {
						inS, outS = []int{1, 2}, []int{2, 2}
						o2.Free()
						o2 = zeros(4)
					}
					if e.r == 0 {
						inS, outS = []int{1, 2}, []int{1, 1}
						o2.Free()
						o2 = zeros(2)
					}
					w, err = e.b.AlltoallBase(e.ctx, e.meta(backend.OpAlltoallBase), o2, a2, backend.AlltoallBaseOptions{InputSplitSizes: inS, OutputSplitSizes: outS, Async: as})
					var want func(i int) float64
					if e.r == 0 { // from rank 0: its element 0; from rank 1: its element 0
						want = func(i int) float64 { return val(dt, i, 0) }
					} else { // from rank 0: elements 1,2; from rank 1: elements 1,2
						want = func(i int) float64 { return val(dt, i/2, 1+i%2) }
					}
					if err := run("alltoall_base uneven", w, err, o2, want); err != nil {
						return err
					}
				}
				ins := make([]*tensor.Tensor, world)
				outs2 := make([]*tensor.Tensor, world)
				for r := range world {
					ins[r] = mk(m, func(i int) float64 { return val(dt, e.r, r*m+i) })
					outs2[r] = zeros(m)
				}
				w, err = e.b.Alltoall(e.ctx, e.meta(backend.OpAlltoall), outs2, ins, backend.AlltoallOptions{Async: as})
				if err := run("alltoall", w, err, nil, nil); err != nil {
					return err
				}
				for r, o := range outs2 {
					if err := run(fmt.Sprintf("alltoall[%d]", r), nil, nil, o, func(i int) float64 { return val(dt, r, e.r*m+i) }); err != nil {
						return err
					}
				}
				// gather and scatter at the last rank
				var gouts [][]*tensor.Tensor
				if e.r == root {
					l := make([]*tensor.Tensor, world)
					for r := range l {
						l[r] = zeros(m)
					}
					gouts = [][]*tensor.Tensor{l}
				}
				w, err = e.b.Gather(e.ctx, e.meta(backend.OpGather), gouts, []*tensor.Tensor{in}, backend.GatherOptions{RootRank: root, Async: as})
				if err := run("gather", w, err, nil, nil); err != nil {
					return err
				}
				if e.r == root {
					for r, o := range gouts[0] {
						if err := run(fmt.Sprintf("gather[%d]", r), nil, nil, o, func(i int) float64 { return val(dt, r, i) }); err != nil {
							return err
						}
					}
				}
				var sins [][]*tensor.Tensor
				if e.r == root {
					l := make([]*tensor.Tensor, world)
					for r := range l {
						l[r] = mk(m, func(i int) float64 { return val(dt, root, r*m+i) })
					}
					sins = [][]*tensor.Tensor{l}
				}
				sout := zeros(m)
				w, err = e.b.Scatter(e.ctx, e.meta(backend.OpScatter), []*tensor.Tensor{sout}, sins, backend.ScatterOptions{RootRank: root, Async: as})
				if err := run("scatter", w, err, sout, func(i int) float64 { return val(dt, root, e.r*m+i) }); err != nil {
					return err
				}
				// coalesced variants
				c1, c2 := mk(m, mine), mk(m+1, mine)
				w, err = e.b.AllreduceCoalesced(e.ctx, e.meta(backend.OpAllreduceCoalesced), []*tensor.Tensor{c1, c2}, backend.AllreduceCoalescedOptions{Async: as})
				if err := run("allreduce_coalesced", w, err, c2, func(i int) float64 { return reduceRef(dt, backend.SUM, world, i) }); err != nil {
					return err
				}
				b1, b2 := zeros(m*world), zeros(m*world)
				w, err = e.b.AllgatherIntoTensorCoalesced(e.ctx, e.meta(backend.OpAllgatherIntoTensorCoalesced), []*tensor.Tensor{b1, b2}, []*tensor.Tensor{in, in}, backend.AllgatherIntoTensorCoalescedOptions{Async: as})
				if err := run("allgather_into_tensor_coalesced", w, err, b2, gathered); err != nil {
					return err
				}
				r1, r2 := zeros(m), zeros(m)
				w, err = e.b.ReduceScatterTensorCoalesced(e.ctx, e.meta(backend.OpReduceScatterTensorCoalesced), []*tensor.Tensor{r1, r2}, []*tensor.Tensor{src, src}, backend.ReduceScatterTensorCoalescedOptions{Async: as})
				if err := run("reduce_scatter_tensor_coalesced", w, err, r2, scattered); err != nil {
					return err
				}
				go1 := [][]*tensor.Tensor{{zeros(m), zeros(m)}, {zeros(m + 1), zeros(m + 1)}}
				go1[0], go1[1] = go1[0][:world], go1[1][:world]
				w, err = e.b.AllgatherCoalesced(e.ctx, e.meta(backend.OpAllgatherCoalesced), go1, []*tensor.Tensor{in, c2}, backend.AllgatherCoalescedOptions{Async: as})
				if err := run("allgather_coalesced", w, err, go1[0][world-1], func(i int) float64 { return val(dt, world-1, i) }); err != nil {
					return err
				}
				return nil
			})
		})
	}
}

var _ = context.Background

// TestUnevenAlltoallAfterEmpty is conftest's "alltoall takes uneven pieces"
// in the order that hung on two GPUs: empty alltoall_base and alltoall
// first (count 0: nothing may reach NCCL), then a list alltoall where rank r
// sends r+p+1 int32s to rank p, in sync mode on the legacy default stream
// (the conformance suite's) and async on the test's stream, then
// alltoall_base with the same split sizes.
func TestUnevenAlltoallAfterEmpty(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	world := len(envs)
	each(t, envs, func(e *rankEnv) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		wait := func(name string) func(backend.Work, error) error {
			return func(w backend.Work, err error) error {
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				if err := w.Wait(ctx); err != nil {
					return fmt.Errorf("%s: wait: %w", name, err)
				}
				if err := w.WaitHost(ctx); err != nil {
					return fmt.Errorf("%s: wait host: %w", name, err)
				}
				return nil
			}
		}
		empty := func() *tensor.Tensor {
			x, err := cuda.Zeros(e.ctx, e.r, tensor.Int32, 0)
			if err != nil {
				panic(err)
			}
			return x
		}
		m := func(op backend.Op) backend.Meta { mt := e.meta(op); mt.Timeout = 10 * time.Second; return mt }
		if err := wait("empty alltoall_base")(e.b.AlltoallBase(e.ctx, m(backend.OpAlltoallBase), empty(), empty(), backend.AlltoallBaseOptions{})); err != nil {
			return err
		}
		eo, ei := make([]*tensor.Tensor, world), make([]*tensor.Tensor, world)
		for p := range world {
			eo[p], ei[p] = empty(), empty()
		}
		if err := wait("empty alltoall")(e.b.Alltoall(e.ctx, m(backend.OpAlltoall), eo, ei, backend.AlltoallOptions{})); err != nil {
			return err
		}
		for _, mode := range []struct {
			name  string
			ctx   context.Context
			async bool
		}{{"sync, default stream", context.Background(), false}, {"async", e.ctx, true}} {
			ins, outs := make([]*tensor.Tensor, world), make([]*tensor.Tensor, world)
			var flat []float64
			inS, outS := make([]int, world), make([]int, world)
			total := 0
			for p := range world {
				v := make([]float64, e.r+p+1)
				for i := range v {
					v[i] = float64(100*e.r + p)
				}
				var err error
				if ins[p], err = e.fromFloats(tensor.Int32, v); err != nil {
					return err
				}
				if outs[p], err = cuda.Zeros(e.ctx, e.r, tensor.Int32, p+e.r+1); err != nil {
					return err
				}
				flat = append(flat, v...)
				inS[p], outS[p] = e.r+p+1, p+e.r+1
				total += p + e.r + 1
			}
			// The inputs were written on the test's stream: let the op's
			// stream see them.
			if err := e.cur.Synchronize(); err != nil {
				return err
			}
			if err := wait("uneven alltoall (" + mode.name + ")")(e.b.Alltoall(mode.ctx, m(backend.OpAlltoall), outs, ins, backend.AlltoallOptions{Async: mode.async})); err != nil {
				return err
			}
			for p := range world {
				got, err := e.read(outs[p])
				if err != nil {
					return err
				}
				if err := expect(got, func(int) float64 { return float64(100*p + e.r) }); err != nil {
					return fmt.Errorf("uneven alltoall (%s), piece from rank %d: %w", mode.name, p, err)
				}
			}
			in, err := e.fromFloats(tensor.Int32, flat)
			if err != nil {
				return err
			}
			out, err := cuda.Zeros(e.ctx, e.r, tensor.Int32, total)
			if err != nil {
				return err
			}
			if err := e.cur.Synchronize(); err != nil {
				return err
			}
			if err := wait("alltoall_base split (" + mode.name + ")")(e.b.AlltoallBase(mode.ctx, m(backend.OpAlltoallBase), out, in,
				backend.AlltoallBaseOptions{InputSplitSizes: inS, OutputSplitSizes: outS, Async: mode.async})); err != nil {
				return err
			}
			got, err := e.read(out)
			if err != nil {
				return err
			}
			off := 0
			for p := range world {
				for range outS[p] {
					if got[off] != float64(100*p+e.r) {
						return fmt.Errorf("alltoall_base split (%s): element %d = %v, want %d", mode.name, off, got[off], 100*p+e.r)
					}
					off++
				}
			}
		}
		return nil
	})
}
