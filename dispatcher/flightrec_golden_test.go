package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/flightrec_golden_*.json from this run")

// TestFlightRecorderDumpGolden pins what the recorder writes: a fixed op
// sequence on two cpupool ranks (allreduce of 1-, 2- and 5-D tensors,
// allreduce_coalesced, both allgathers, broadcast, send/recv, barrier,
// reduce_scatter_tensor, a subgroup's broadcast, an op with hooks on, an
// op the dispatcher refuses, which is not recorded) and, at world 1 on
// the test backend, ops it refuses (their errors in the entries), must
// dump byte for byte the JSON of testdata/flightrec_golden_*.json, with
// the times, durations' values and the random uid zeroed. The recorder's
// hot path is rewritten for speed from time to time; this is what says
// that no dump changed with it. -update-golden rewrites the files (only
// for a deliberate change of the dump).
func TestFlightRecorderDumpGolden(t *testing.T) {
	const world = 2
	st := store.NewHashStore()
	dir := t.TempDir()
	pgs := testgroup.StartClosed(t, world, func(r int) (*ProcessGroup, error) {
		// Timed, so that the dump has every field, duration_ms too.
		return Init(context.Background(), Config{Backend: "cpupool", Store: st, Rank: r, WorldSize: world, Timeout: 20 * time.Second,
			BackendOptions: map[string]any{cpupool.Name: &cpupool.Options{EnableTiming: true}},
			FlightRecorder: FlightRecorderOptions{Entries: 64, DumpPrefix: filepath.Join(dir, "r"), NoDumpOnError: true}})
	})
	errs := make(chan error, world)
	for r, pg := range pgs {
		go func() { errs <- goldenOps(pg, r) }()
	}
	for range world {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("ops did not complete in 30 s")
		}
	}
	for r, pg := range pgs {
		checkGolden(t, fmt.Sprintf("flightrec_golden_cpupool_rank%d.json", r), pg.FlightRecorder().Snapshot("golden"))
	}

	// Ops the backend refuses: reccpu leaves Reduce and Scatter
	// unimplemented, so their entries carry the error.
	pg, err := Init(context.Background(), Config{Backend: "reccpu", Store: store.NewHashStore(), WorldSize: 1,
		BackendOptions: map[string]any{"reccpu": &callLog{}},
		FlightRecorder: FlightRecorderOptions{Entries: 4, DumpPrefix: filepath.Join(dir, "u"), NoDumpOnError: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	ctx := context.Background()
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 3)}
	// Six ops on a ring of 4: the dump holds the last four, the ring wrapped.
	for k := range 6 {
		var err error
		switch k % 3 {
		case 0:
			_, err = pg.Allreduce(ctx, x, backend.AllreduceOptions{})
		case 1:
			_, err = pg.Reduce(ctx, x, backend.ReduceOptions{})
		case 2:
			_, err = pg.Scatter(ctx, x, [][]*tensor.Tensor{{tensor.New(tensor.Float32, 3)}}, backend.ScatterOptions{})
		}
		if (k%3 == 0) != (err == nil) {
			t.Fatalf("op %d: err %v", k, err)
		}
	}
	checkGolden(t, "flightrec_golden_refused.json", pg.FlightRecorder().Snapshot("golden"))
}

// goldenOps issues TestFlightRecorderDumpGolden's sequence on rank r,
// waiting for each op.
func goldenOps(pg *ProcessGroup, r int) error {
	ctx := context.Background()
	f := func(dt tensor.DType, shape ...int) *tensor.Tensor { return tensor.New(dt, shape...) }
	sub, err := pg.NewGroup(ctx, []int{0, 1}, GroupOptions{Desc: "sub"})
	if err != nil {
		return err
	}
	ops := []func() (backend.Work, error){
		func() (backend.Work, error) {
			return pg.Allreduce(ctx, []*tensor.Tensor{f(tensor.Float32, 4)}, backend.AllreduceOptions{})
		},
		func() (backend.Work, error) {
			return pg.Allreduce(ctx, []*tensor.Tensor{f(tensor.Float64, 2, 3)}, backend.AllreduceOptions{ReduceOp: backend.MAX})
		},
		func() (backend.Work, error) {
			return pg.Allreduce(ctx, []*tensor.Tensor{f(tensor.Float16, 1, 2, 1, 2, 1)}, backend.AllreduceOptions{})
		},
		func() (backend.Work, error) {
			return pg.AllreduceCoalesced(ctx, []*tensor.Tensor{f(tensor.Float32, 3), f(tensor.Float32, 2, 2)}, backend.AllreduceCoalescedOptions{})
		},
		func() (backend.Work, error) {
			return pg.AllgatherIntoTensor(ctx, f(tensor.Int32, 6), f(tensor.Int32, 3), backend.AllgatherIntoTensorOptions{})
		},
		func() (backend.Work, error) {
			return pg.Allgather(ctx, [][]*tensor.Tensor{{f(tensor.Int64, 2), f(tensor.Int64, 2)}}, []*tensor.Tensor{f(tensor.Int64, 2)}, backend.AllgatherOptions{})
		},
		func() (backend.Work, error) {
			return pg.Broadcast(ctx, []*tensor.Tensor{f(tensor.BFloat16, 5)}, backend.BroadcastOptions{RootRank: 1})
		},
		func() (backend.Work, error) {
			if r == 0 {
				return pg.Send(ctx, []*tensor.Tensor{f(tensor.Float32, 2)}, 1, backend.SendOptions{})
			}
			return pg.Recv(ctx, []*tensor.Tensor{f(tensor.Float32, 2)}, 0, backend.RecvOptions{})
		},
		func() (backend.Work, error) { return pg.Barrier(ctx, backend.BarrierOptions{}) },
		func() (backend.Work, error) {
			return pg.ReduceScatterTensor(ctx, f(tensor.Float32, 2), f(tensor.Float32, 4), backend.ReduceScatterTensorOptions{})
		},
		func() (backend.Work, error) {
			return sub.Broadcast(ctx, []*tensor.Tensor{f(tensor.Uint8, 7)}, backend.BroadcastOptions{})
		},
		func() (backend.Work, error) {
			pg.AddHooks(Hooks{Pre: func(context.Context, OpInfo) {}, Post: func(context.Context, OpInfo, backend.Work, error) {}})
			return pg.Allreduce(ctx, []*tensor.Tensor{f(tensor.Float32, 8)}, backend.AllreduceOptions{Timeout: 5 * time.Second})
		},
	}
	for k, op := range ops {
		w, err := op()
		if err != nil {
			return fmt.Errorf("rank %d, op %d: %w", r, k, err)
		}
		if err := w.Wait(ctx); err != nil {
			return fmt.Errorf("rank %d, op %d: %w", r, k, err)
		}
	}
	// Refused by the dispatcher's checks: not recorded.
	if _, err := pg.Allreduce(ctx, nil, backend.AllreduceOptions{}); err == nil {
		return fmt.Errorf("rank %d: an allreduce of no tensors was accepted", r)
	}
	return nil
}

// checkGolden compares d, its times, durations and uid zeroed, as Dump
// encodes it, with testdata/name (or writes it there, with
// -update-golden).
func checkGolden(t *testing.T, name string, d frtrace.Dump) {
	t.Helper()
	d.DumpTimeNs, d.DumpTime, d.PGUID, d.RunID, d.Sections = 0, "", "", "", nil
	for i := range d.Entries {
		e := &d.Entries[i]
		if e.State != frtrace.StateCompleted && e.Error == "" {
			t.Errorf("%s: entry %d (%s) is %s: every op was waited for", name, i, e.ProfilingName, e.State)
		}
		e.TimeCreatedNs, e.TimeStartedNs, e.TimeCompletedNs = 0, 0, 0
		if e.DurationMs != nil {
			zero := 0.0
			e.DurationMs = &zero
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(d); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-golden to make it)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("%s: the dump differs from the golden file; got:\n%s", path, buf.Bytes())
	}
}
