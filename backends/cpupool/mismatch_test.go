package cpupool_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/tensor"
)

// TestMismatchedCollectives: ranks that pass one collective different
// dtypes of one size (float32 against int32: the bytes line up, so only
// the frames' fingerprints can tell), different reduce ops or different
// ops all fail with ErrInvalidArgument, with the same words on both ranks,
// naming both ranks, their ops, dtypes and sizes, on both transports.
func TestMismatchedCollectives(t *testing.T) {
	ctx := context.Background()
	type call func(b backend.Backend, r int) (backend.Work, error)
	allreduce := func(dt func(r int) tensor.DType, op func(r int) backend.ReduceOp) call {
		return func(b backend.Backend, r int) (backend.Work, error) {
			return b.Allreduce(ctx, backend.Meta{Timeout: 10 * time.Second}, []*tensor.Tensor{tensor.New(dt(r), 1024)}, backend.AllreduceOptions{ReduceOp: op(r)})
		}
	}
	f32 := func(int) tensor.DType { return tensor.Float32 }
	sum := func(int) backend.ReduceOp { return backend.SUM }
	for _, tc := range []struct {
		name string
		call call
		want string
	}{
		{"dtype", allreduce(func(r int) tensor.DType { return []tensor.DType{tensor.Float32, tensor.Int32}[r] }, sum),
			"rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (SUM)"},
		{"reduce op", allreduce(f32, func(r int) backend.ReduceOp { return []backend.ReduceOp{backend.SUM, backend.MAX}[r] }),
			"rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce float32 x 1024 (MAX)"},
		{"op", func(b backend.Backend, r int) (backend.Work, error) {
			x := tensor.New(tensor.Float32, 1024)
			if r == 0 {
				return b.Allreduce(ctx, backend.Meta{Timeout: 10 * time.Second}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			}
			return b.Broadcast(ctx, backend.Meta{Timeout: 10 * time.Second}, []*tensor.Tensor{x}, backend.BroadcastOptions{})
		}, "rank 0 allreduce float32 x 1024 (SUM), rank 1 broadcast float32 x 1024"},
		// On one host a barrier is a one-byte MAX allreduce over the lanes
		// (barrierLanes): its fingerprint still says barrier.
		{"barrier", func(b backend.Backend, r int) (backend.Work, error) {
			if r == 0 {
				return b.Barrier(ctx, backend.Meta{Timeout: 10 * time.Second}, backend.BarrierOptions{})
			}
			return b.Allreduce(ctx, backend.Meta{Timeout: 10 * time.Second}, []*tensor.Tensor{tensor.New(tensor.Uint8, 1)}, backend.AllreduceOptions{ReduceOp: backend.MAX})
		}, "rank 0 barrier, rank 1 allreduce uint8 x 1 (MAX)"},
		{"count", allreduce(f32, sum), ""}, // same count: no error (a control)
	} {
		for _, tr := range []string{"tcp", "shm"} {
			t.Run(tc.name+"/"+tr, func(t *testing.T) {
				bs := group(t, 2, &cpupool.Options{Transport: tr})
				errs := make([]error, 2)
				var wg sync.WaitGroup
				for r, b := range bs {
					wg.Go(func() {
						w, err := tc.call(b, r)
						if err == nil {
							err = w.Wait(ctx)
						}
						errs[r] = err
					})
				}
				wg.Wait()
				if tc.want == "" {
					for r, err := range errs {
						if err != nil {
							t.Fatalf("rank %d: %v", r, err)
						}
					}
					return
				}
				var details []string
				for r, err := range errs {
					var oe *backend.OpError
					if !errors.Is(err, backend.ErrInvalidArgument) || !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{0, 1}) {
						t.Fatalf("rank %d: want ErrInvalidArgument naming ranks [0 1], got %v", r, err)
					}
					if !strings.Contains(oe.Detail, tc.want) {
						t.Fatalf("rank %d: detail %q, want it to name %q", r, oe.Detail, tc.want)
					}
					details = append(details, oe.Detail)
				}
				if details[0] != details[1] {
					t.Fatalf("the ranks' words differ: %q, %q", details[0], details[1])
				}
			})
		}
	}
}
