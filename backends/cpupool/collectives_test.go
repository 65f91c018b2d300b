package cpupool_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// datum is rank r's element i: distinct for every (rank, element) pair, so
// a result taken from the wrong rank or the wrong block cannot pass.
func datum(r, i int) float64 { return float64(10*r + i + 1) }

func rankData(r, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = datum(r, i)
	}
	return v
}

// waited waits for the Work of an op call, or returns the call's error.
func waited(w backend.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(context.Background())
}

func expect(what string, got, want []float64) error {
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

// TestCollectivesThroughBackend calls every rooted op with every root, and
// the reductions with MAX and MIN, through the backend at 4 ranks, checking
// every element of every block.
func TestCollectivesThroughBackend(t *testing.T) {
	ctx := context.Background()
	const n, elems = 4, 3
	bs := group(t, n, nil)
	each(t, bs, func(r int, b backend.Backend) error {
		for root := range n {
			x, _ := tensor.FromFloat64s(tensor.Float64, rankData(r, elems))
			if err := waited(b.Broadcast(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.BroadcastOptions{RootRank: root})); err != nil {
				return err
			}
			got, _ := x.Float64s()
			if err := expect(fmt.Sprintf("broadcast from root %d on rank %d", root, r), got, rankData(root, elems)); err != nil {
				return err
			}
		}

		for _, op := range []backend.ReduceOp{backend.MAX, backend.MIN} {
			x, _ := tensor.FromFloat64s(tensor.Float64, rankData(r, elems))
			if err := waited(b.Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op})); err != nil {
				return err
			}
			want := rankData(n-1, elems) // data grows with the rank
			if op == backend.MIN {
				want = rankData(0, elems)
			}
			got, _ := x.Float64s()
			if err := expect(fmt.Sprintf("allreduce %v on rank %d", op, r), got, want); err != nil {
				return err
			}
		}

		for root := range n {
			x, _ := tensor.FromFloat64s(tensor.Float64, rankData(r, elems))
			if err := waited(b.Reduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.ReduceOptions{RootRank: root, ReduceOp: backend.MAX})); err != nil {
				return err
			}
			if r == root {
				got, _ := x.Float64s()
				if err := expect(fmt.Sprintf("reduce MAX to root %d", root), got, rankData(n-1, elems)); err != nil {
					return err
				}
			}
		}

		// reduce_scatter_tensor: rank r's input is n blocks; block j of rank
		// r holds datum(r, j*elems+i). Rank j receives the sum of block j.
		in, _ := tensor.FromFloat64s(tensor.Float64, rankData(r, n*elems))
		out := tensor.New(tensor.Float64, elems)
		if err := waited(b.ReduceScatterTensor(ctx, backend.Meta{}, out, in, backend.ReduceScatterTensorOptions{})); err != nil {
			return err
		}
		want := make([]float64, elems)
		for i := range want {
			for q := range n {
				want[i] += datum(q, r*elems+i)
			}
		}
		got, _ := out.Float64s()
		if err := expect(fmt.Sprintf("reduce_scatter_tensor on rank %d", r), got, want); err != nil {
			return err
		}

		// allgather, list form: block q must be rank q's input.
		mine, _ := tensor.FromFloat64s(tensor.Float64, rankData(r, elems))
		outs := make([]*tensor.Tensor, n)
		for q := range outs {
			outs[q] = tensor.New(tensor.Float64, elems)
		}
		if err := waited(b.Allgather(ctx, backend.Meta{}, [][]*tensor.Tensor{outs}, []*tensor.Tensor{mine}, backend.AllgatherOptions{})); err != nil {
			return err
		}
		for q, o := range outs {
			got, _ := o.Float64s()
			if err := expect(fmt.Sprintf("allgather block %d on rank %d", q, r), got, rankData(q, elems)); err != nil {
				return err
			}
		}

		// allgather_into_tensor: block q of the output is rank q's input.
		flat := tensor.New(tensor.Float64, n*elems)
		if err := waited(b.AllgatherIntoTensor(ctx, backend.Meta{}, flat, mine, backend.AllgatherIntoTensorOptions{})); err != nil {
			return err
		}
		gotAll, _ := flat.Float64s()
		for q := range n {
			if err := expect(fmt.Sprintf("allgather_into_tensor block %d on rank %d", q, r), gotAll[q*elems:(q+1)*elems], rankData(q, elems)); err != nil {
				return err
			}
		}

		// alltoall: rank r sends block q (datum(r, q)) to rank q, and
		// receives rank q's block r.
		ins, outs2 := make([]*tensor.Tensor, n), make([]*tensor.Tensor, n)
		for q := range n {
			ins[q], _ = tensor.FromFloat64s(tensor.Float64, []float64{datum(r, q)})
			outs2[q] = tensor.New(tensor.Float64, 1)
		}
		if err := waited(b.Alltoall(ctx, backend.Meta{}, outs2, ins, backend.AlltoallOptions{})); err != nil {
			return err
		}
		for q, o := range outs2 {
			if got := o.At(0); got != datum(q, r) {
				return fmt.Errorf("alltoall on rank %d: block %d is %v, want %v", r, q, got, datum(q, r))
			}
		}
		return nil
	})
}
