package nccl_test

import (
	"context"
	"testing"

	"github.com/gocoll/gocoll/backend"
	_ "github.com/gocoll/gocoll/backends/nccl" // registers "nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// BenchmarkDebugDetailNCCL is the cost, per 8-byte allreduce issued
// through the dispatcher on one GPU (world 1, sync mode, the stream
// synchronised every 256 ops), of GOCOLL_DEBUG=detail against off. At
// world 1 the fingerprint check has no peer to compare with, so what it
// measures is the check's wrapper on the issue path; the store round trips
// of a larger world are BenchmarkDebugDetail's (package dispatcher).
func BenchmarkDebugDetailNCCL(b *testing.B) {
	if n, err := cuda.DeviceCount(); err != nil || n < 1 {
		b.Skipf("needs a GPU: %v", err)
	}
	for _, debug := range []string{"off", "detail"} {
		b.Run(debug, func(b *testing.B) {
			dev := tensor.CUDADevice(0)
			pg, err := dispatcher.Init(context.Background(), dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1,
				Backend: "cuda:nccl", Device: &dev, Debug: debug, Monitor: dispatcher.MonitorOptions{Disable: true}})
			if err != nil {
				b.Fatal(err)
			}
			defer pg.Close(context.Background())
			d, err := cuda.GetDevice(0)
			if err != nil {
				b.Fatal(err)
			}
			s, err := d.NewStream(cuda.StreamOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := cuda.WithStream(context.Background(), s)
			x, err := cuda.Zeros(ctx, 0, tensor.Float32, 2)
			if err != nil {
				b.Fatal(err)
			}
			xs := []*tensor.Tensor{x}
			k := 0
			for b.Loop() {
				w, err := pg.Allreduce(ctx, xs, backend.AllreduceOptions{})
				if err == nil {
					err = w.Wait(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
				if k++; k%256 == 0 {
					if err := s.SynchronizeContext(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
			_ = s.SynchronizeContext(context.Background())
		})
	}
}
