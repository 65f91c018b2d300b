package nccl

import (
	"context"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// BenchmarkDriverCalls splits the CUDA floor of an async allreduce + Wait
// (FloorAllreduce, `conftest bench hostcost`'s "nccl + CUDA calls") into
// its driver calls, each timed on its own from C (gn_bench_calls), at
// world 1 with a 1-element float32 allreduce, in batches of 256 with the
// queue drained between batches. Each metric is host ns per op of one call
// with the clock read it carries; "clock" is that read alone, to subtract.
// events is the backend's design; events-rotating records a different sync
// event each op, of 64 in turn (of 65536 in events-rotating-65536: the
// pool's size when events come back only at the watchdog's rounds, each
// record then on a cold event); memops orders the streams with cuStreamWriteValue32 /
// cuStreamWaitValue32 on device-mapped host words instead of events, and
// its query-end is a host load of the end word.
func BenchmarkDriverCalls(b *testing.B) {
	envs := newRanks(b, 1, testOpts())
	e := envs[0]
	x, err := cuda.Zeros(e.ctx, e.r, tensor.Float32, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Free()
	for _, v := range []struct {
		name        string
		mode, nsync int
	}{{"events", 0, 0}, {"events-rotating", 1, 64}, {"events-rotating-65536", 1, 65536}, {"memops", 2, 0}} {
		mode := v.mode
		b.Run(v.name, func(b *testing.B) {
			cb := callsBench{nsync: v.nsync}
			defer cb.free()
			var ns [len(callSlots)]int64
			drain := func() {
				if err := e.cur.SynchronizeContext(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			// Warm up (connections, the event pool).
			if err := e.b.driverCalls(e.ctx, x, e.cur, 256, mode, &cb, &ns); err != nil {
				b.Fatal(err)
			}
			drain()
			ns = [len(callSlots)]int64{}
			b.ResetTimer()
			for k := 0; k < b.N; k += 256 {
				if err := e.b.driverCalls(e.ctx, x, e.cur, min(256, b.N-k), mode, &cb, &ns); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				drain()
				b.StartTimer()
			}
			var sum int64
			for i, n := range ns {
				b.ReportMetric(float64(n)/float64(b.N), callSlots[i]+"-ns/op")
				if i > 0 && i != int(len(callSlots)-1) {
					sum += n
				}
			}
			b.ReportMetric(float64(sum)/float64(b.N), "floor-ns/op")
		})
	}
}

// BenchmarkIssueCrossing splits the host cost of a current-stream async
// allreduce + Wait (Options.AsyncOnCurrentStream; world 1, 1 element, in
// batches of 256 with the stream drained between batches, untimed):
// c-loop makes its driver calls and NCCL's from a C loop
// (FloorAllreduceCurrentStream); go-cgo makes the same calls through one
// cgo crossing per op from a Go loop that does nothing else (issueLoop);
// backend is the backend's Allreduce + Wait. go-cgo minus c-loop is the
// crossing (and the colder caches a crossing brings); backend minus go-cgo
// is the backend's own Go. The -Nev variants record a different end event
// per op, of N in turn, as the backend's event pool does (c-loop-256ev
// minus c-loop is what rotating events cost the driver); backend-nostash
// is backend without the stash (the test-only knob DisableStash), which
// prices the stash's reference counting.
func BenchmarkIssueCrossing(b *testing.B) {
	o := testOpts()
	o.AsyncOnCurrentStream = true
	e := newRanks(b, 1, o)[0]
	x, err := cuda.Zeros(e.ctx, e.r, tensor.Float32, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Free()
	xs := []*tensor.Tensor{x}
	async := backend.AllreduceOptions{Async: true}
	c, err := e.b.commFor(e.ctx, x)
	if err != nil {
		b.Fatal(err)
	}
	rots := map[int]*rotBench{}
	for _, n := range []int{256, 2048} {
		if rots[n], err = newRotBench(c, n); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		if err := e.cur.Synchronize(); err == nil {
			for _, rb := range rots {
				rb.free()
			}
		}
	}()
	backendLoop := func(n int) error {
		for range n {
			w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), xs, async)
			if err != nil {
				return err
			}
			if err := w.Wait(e.ctx); err != nil {
				return err
			}
		}
		return nil
	}
	variants := []struct {
		name    string
		run     func(n int) error
		nostash bool
	}{
		{name: "c-loop", run: func(n int) error { _, err := e.b.FloorAllreduceCurrentStream(e.ctx, x, e.cur, n); return err }},
		{name: "c-loop-256ev", run: func(n int) error { return e.b.floorCurEvs(e.ctx, x, e.cur, rots[256], n) }},
		{name: "c-loop-2048ev", run: func(n int) error { return e.b.floorCurEvs(e.ctx, x, e.cur, rots[2048], n) }},
		{name: "go-cgo", run: func(n int) error { return e.b.issueLoop(e.ctx, x, e.cur, n) }},
		{name: "go-cgo-256ev", run: func(n int) error { return e.b.issueLoopEvs(e.ctx, x, e.cur, rots[256], n) }},
		{name: "backend", run: backendLoop},
		{name: "backend-nostash", run: backendLoop, nostash: true},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			// The test-only knob, read by newWork on this goroutine alone.
			e.b.test.DisableStash = v.nostash
			defer func() { e.b.test.DisableStash = false }()
			if err := v.run(256); err != nil { // warm up
				b.Fatal(err)
			}
			if err := e.cur.Synchronize(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for k := 0; k < b.N; k += 256 {
				if err := v.run(min(256, b.N-k)); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := e.cur.Synchronize(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
