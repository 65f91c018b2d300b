package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	_ "github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// BenchmarkDispatchVsDirect is what the dispatcher adds to a real
// backend's op: an 8 B float32 SUM allreduce, issued and waited for, on
// cpupool at world 1, made straight on the backend ("direct") and through
// ProcessGroup.Allreduce ("dispatcher"), in alternating batches of 256 in
// the same invocation, so that both see the same machine. One iteration
// is one op of each; the metrics are each side's ns per op, their
// difference (delta-ns/op) and their ratio (dispatcher/direct).
//
// The direct calls are numbered from the group's own counter, as the
// dispatcher numbers them, so that the backend sees one sequence.
func BenchmarkDispatchVsDirect(b *testing.B) {
	for _, c := range []struct {
		name    string
		entries int
	}{{"recorder-on", 0}, {"recorder-off", -1}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			pg, err := Init(ctx, Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "cpupool",
				FlightRecorder: FlightRecorderOptions{Entries: c.entries, DumpPrefix: b.TempDir() + "/r"}})
			if err != nil {
				b.Fatal(err)
			}
			defer pg.Close(ctx)
			be, err := pg.Backend(tensor.CPU)
			if err != nil {
				b.Fatal(err)
			}
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
			direct := func() error {
				m := backend.Meta{Op: backend.OpAllreduce, Seq: pg.collSeq.Add(1), Timeout: pg.timeout}
				w, err := be.Allreduce(ctx, m, x, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				return w.Wait(ctx)
			}
			dispatched := func() error {
				w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				return w.Wait(ctx)
			}
			const batch = 256
			var dDirect, dDisp time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				k := min(batch, b.N-done)
				t0 := time.Now()
				for range k {
					if err := direct(); err != nil {
						b.Fatal(err)
					}
				}
				t1 := time.Now()
				for range k {
					if err := dispatched(); err != nil {
						b.Fatal(err)
					}
				}
				dDirect, dDisp = dDirect+t1.Sub(t0), dDisp+time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(dDirect.Nanoseconds())/n, "direct-ns/op")
			b.ReportMetric(float64(dDisp.Nanoseconds())/n, "dispatcher-ns/op")
			b.ReportMetric(float64((dDisp-dDirect).Nanoseconds())/n, "delta-ns/op")
			b.ReportMetric(float64(dDisp)/float64(dDirect), "ratio")
		})
	}
}
