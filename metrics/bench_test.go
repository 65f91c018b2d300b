package metrics_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/metrics"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// nop is a backend whose allreduce costs nothing, as in dispatcher's
// BenchmarkDispatchAllreduce, so that the benchmark measures the
// dispatcher and the metrics alone.
type nop struct{ backend.Unimplemented }

var doneWork = backend.CompletedWork(0, nil, nil)

func (*nop) Name() string { return "nopbench" }
func (*nop) Capabilities() backend.Capabilities {
	return backend.Capabilities{Devices: []tensor.DeviceType{tensor.CPU}}
}
func (*nop) Rank() int                          { return 0 }
func (*nop) Size() int                          { return 1 }
func (*nop) Close(context.Context) error        { return nil }
func (*nop) Abort(context.Context, error) error { return nil }
func (*nop) Allreduce(context.Context, backend.Meta, []*tensor.Tensor, backend.AllreduceOptions) (backend.Work, error) {
	return doneWork, nil
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopAsync's allreduce returns a HostWork that is not complete: the
// benchmark completes it right after the call, so the metrics follow it
// on their follower, the path of a real backend's works.
type nopAsync struct{ nop }

func (*nopAsync) Name() string { return "nopasync" }
func (*nopAsync) Allreduce(_ context.Context, m backend.Meta, _ []*tensor.Tensor, _ backend.AllreduceOptions) (backend.Work, error) {
	return backend.NewHostWork(m.Seq, false, nil), nil
}

func init() {
	backend.Register(backend.Driver{Name: "nopasync", Devices: []tensor.DeviceType{tensor.CPU},
		New: func(context.Context, backend.Config) (backend.Backend, error) { return &nopAsync{}, nil }})
	backend.Register(backend.Driver{Name: "nopbench", Devices: []tensor.DeviceType{tensor.CPU},
		New: func(context.Context, backend.Config) (backend.Backend, error) { return &nop{}, nil }})
}

// BenchmarkDispatchAllreduce is dispatcher's benchmark of the same name
// with metrics off and on (an Exporter over its own registry, no
// listener; the default sampling of latencies, and every op timed), with
// the flight recorder off and on: the difference is the metrics' cost per
// op. The async cases return a Work that completes after the call, which
// the metrics hand to their follower goroutine.
func BenchmarkDispatchAllreduce(b *testing.B) {
	for _, c := range []struct {
		name    string
		entries int
		metrics bool
		every   int    // Options.TimeEvery
		backend string // nopasync: the Work completes after the call
	}{{"recorder-off/metrics-off", -1, false, 0, "nopbench"}, {"recorder-off/metrics-on", -1, true, 0, "nopbench"},
		{"recorder-off/metrics-on-time-every-op", -1, true, 1, "nopbench"},
		{"recorder-on/metrics-off", 0, false, 0, "nopbench"}, {"recorder-on/metrics-on", 0, true, 0, "nopbench"},
		{"recorder-on/metrics-on-time-every-op", 0, true, 1, "nopbench"},
		{"async/recorder-off/metrics-off", -1, false, 0, "nopasync"}, {"async/recorder-off/metrics-on", -1, true, 0, "nopasync"}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := dispatcher.Config{Store: store.NewHashStore(), WorldSize: 1, Backend: c.backend,
				FlightRecorder: dispatcher.FlightRecorderOptions{Entries: c.entries, DumpPrefix: b.TempDir() + "/r"}}
			if c.metrics {
				cfg.Metrics = metrics.New(metrics.Options{TimeEvery: c.every})
			}
			pg, err := dispatcher.Init(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pg.Close(context.Background())
			ctx := context.Background()
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 1024)}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for b.Loop() {
				w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if hw, ok := w.(*backend.HostWork); ok && !hw.IsCompleted() {
					hw.Complete(nil, nil)
				}
			}
			// The process's CPU time per op beside the wall time: on a
			// shared machine other processes stretch ns/op, not this.
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
