package opcheck_test

import (
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/tensor"
)

// TestWords: the sentences name both ranks, lower first whichever side
// asks, with their ops, dtypes, sizes and reduce ops.
func TestWords(t *testing.T) {
	sum, maxOp := backend.SUM, backend.MAX
	f := opcheck.Of(backend.OpAllreduce, tensor.Float32, &sum, 1024)
	i := opcheck.Of(backend.OpAllreduce, tensor.Int32, &maxOp, 1024)
	want := "the ranks passed different collectives: rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (MAX)"
	if got := opcheck.Detail(0, f, 1, i); got != want {
		t.Errorf("Detail(0, 1) = %q, want %q", got, want)
	}
	if got := opcheck.Detail(1, i, 0, f); got != want {
		t.Errorf("Detail(1, 0) = %q, want %q", got, want)
	}
	a2a := opcheck.Of(backend.OpAlltoall, tensor.Float64, nil, -1)
	if got, want := opcheck.Describe(a2a), "alltoall float64"; got != want {
		t.Errorf("Describe(alltoall) = %q, want %q", got, want)
	}
	if got, want := opcheck.Describe(opcheck.Of(backend.OpBarrier, 0, nil, 0)), "barrier"; got != want {
		t.Errorf("Describe(barrier) = %q, want %q", got, want)
	}
	if got, want := opcheck.SizeDetail(3, 8, 1, 4), "the ranks passed tensors of different sizes: rank 1 4 bytes, rank 3 8 bytes"; got != want {
		t.Errorf("SizeDetail = %q, want %q", got, want)
	}
	b := opcheck.Of(backend.OpBroadcast, tensor.Float32, nil, 4)
	if got, want := opcheck.RootDetail(2, b, 1, 0, 0), "the ranks passed different roots: rank 0 broadcast float32 x 4 from root 0, rank 2 the same from root 1"; got != want {
		t.Errorf("RootDetail = %q, want %q", got, want)
	}
}
