package dispatcher

import (
	"context"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// nop is a backend whose allreduce costs nothing, so that the benchmark
// measures the dispatcher alone: validation, numbering, hooks.
type nop struct{ recorder }

var doneWork = backend.CompletedWork(0, nil, nil)

func (*nop) Allreduce(context.Context, backend.Meta, []*tensor.Tensor, backend.AllreduceOptions) (backend.Work, error) {
	return doneWork, nil
}

// nopGroup is a group of one rank over the nop backend, with a recorder
// of entries (-1: off), and the tensor list its ops take; the timer is
// reset.
func nopGroup(b *testing.B, entries int) (*ProcessGroup, []*tensor.Tensor) {
	pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu",
		FlightRecorder: FlightRecorderOptions{Entries: entries, DumpPrefix: b.TempDir() + "/r"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pg.Close(context.Background()) })
	swapBackend(pg, tensor.CPU, &nop{})
	b.ReportAllocs()
	b.ResetTimer()
	return pg, []*tensor.Tensor{tensor.New(tensor.Float32, 1024)}
}

// BenchmarkDispatchAllreduce is the dispatcher's cost per op, with the
// flight recorder on (the default) and off.
func BenchmarkDispatchAllreduce(b *testing.B) {
	for _, c := range []struct {
		name    string
		entries int
	}{{"recorder-off", -1}, {"recorder-on", 0}} {
		b.Run(c.name, func(b *testing.B) {
			pg, x := nopGroup(b, c.entries)
			ctx := context.Background()
			for b.Loop() {
				if _, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDispatchAllreduceWait is BenchmarkDispatchAllreduce for the
// blocking form (AllreduceWait) against the async form and its Wait, with
// the recorder on and off: what the blocking form's own steps (the
// recorder's retire, the release) cost.
func BenchmarkDispatchAllreduceWait(b *testing.B) {
	for _, c := range []struct {
		name    string
		entries int
	}{{"recorder-off", -1}, {"recorder-on", 0}} {
		for _, form := range []string{"async", "wait"} {
			b.Run(c.name+"/"+form, func(b *testing.B) {
				pg, x := nopGroup(b, c.entries)
				ctx := context.Background()
				var err error
				for b.Loop() {
					if form == "wait" {
						err = pg.AllreduceWait(ctx, x, backend.AllreduceOptions{})
					} else if w, werr := pg.Allreduce(ctx, x, backend.AllreduceOptions{}); werr == nil {
						err = w.Wait(ctx)
					} else {
						err = werr
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
