package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// initRecorded starts world ranks with flight recorders configured by fro.
func initRecorded(t *testing.T, world int, fro FlightRecorderOptions) []*ProcessGroup {
	t.Helper()
	return initGroups(t, world, Config{Backend: "reccpu", Timeout: 5 * time.Second, FlightRecorder: fro})
}

func TestFlightRecorderRing(t *testing.T) {
	dir := t.TempDir()
	pg := initRecorded(t, 2, FlightRecorderOptions{Entries: 10, DumpPrefix: filepath.Join(dir, "rank_")})[0]
	ctx := context.Background()
	x := []*tensor.Tensor{tensor.New(tensor.BFloat16, 2, 3)}
	for range 14 {
		if _, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pg.Send(ctx, x, 1, backend.SendOptions{}); err != nil {
		t.Fatal(err)
	}
	path, err := pg.FlightRecorder().Dump("test")
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "rank_0") {
		t.Fatalf("dump path %s", path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// PyTorch's field names, as its fr_trace reads them.
	for _, key := range []string{`"version": "2.10"`, `"pg_config"`, `"pg_status"`, `"last_enqueued_collective": 14`,
		`"last_completed_collective": 14`, `"collective_seq_id"`, `"p2p_seq_id"`, `"profiling_name": "reccpu:all_reduce"`,
		`"time_created_ns"`, `"input_sizes"`, `"input_dtypes"`, `"output_sizes"`, `"state": "completed"`,
		`"time_discovered_completed_ns"`, `"timeout_ms": 5000`, `"is_p2p": true`, `"profiling_name": "reccpu:send 0->1"`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("dump lacks %s", key)
		}
	}
	var d frtrace.Dump
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Entries) != 10 || d.Entries[0].RecordID != 5 || d.Entries[9].RecordID != 14 {
		t.Fatalf("ring kept %d entries, ids %d..%d; want the last 10 (5..14)", len(d.Entries), d.Entries[0].RecordID, d.Entries[len(d.Entries)-1].RecordID)
	}
	last := d.Entries[9]
	if !last.IsP2P || last.CollectiveSeqID != 0 || last.P2PSeqID != 1 {
		t.Fatalf("p2p entry %+v", last)
	}
	if e := d.Entries[0]; e.CollectiveSeqID != 6 || e.InputDtypes[0] != "bfloat16" || len(e.InputSizes[0]) != 2 || !e.Retired {
		t.Fatalf("oldest entry %+v", e)
	}
	if d.PGConfig["0"].Desc != "default_pg" {
		t.Fatalf("pg_config %+v", d.PGConfig)
	}
}

func TestFlightRecorderDumpsOnErrorAndOnDemand(t *testing.T) {
	dir := t.TempDir()
	pg := initRecorded(t, 1, FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "trace_"), PipeFile: filepath.Join(dir, "pipe_")})[0]
	x := tensor.New(tensor.Float32, 1)
	// The recorder backend fails reduce_scatter_tensor.
	if _, err := pg.ReduceScatterTensor(context.Background(), x, x, backend.ReduceScatterTensorOptions{}); err == nil {
		t.Fatal("expected the backend's error")
	}
	d := readDump(t, filepath.Join(dir, "trace_0"))
	if !strings.HasPrefix(d.DumpReason, "error: ") || d.Entries[0].Error == "" {
		t.Fatalf("dump on error: reason %q entries %+v", d.DumpReason, d.Entries)
	}
	os.Remove(filepath.Join(dir, "trace_0"))
	// Writing "1" to the pipe asks for a dump.
	pipe := filepath.Join(dir, "pipe_0.pipe")
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.OpenFile(pipe, os.O_WRONLY, 0)
		if err == nil {
			f.WriteString("1\n")
			f.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipe %s: %v", pipe, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "trace_0")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no dump after writing to the pipe")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := readDump(t, filepath.Join(dir, "trace_0")); d.DumpReason != "on demand (pipe)" {
		t.Fatalf("reason %q", d.DumpReason)
	}
}

func readDump(t *testing.T, path string) frtrace.Dump {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d frtrace.Dump
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFlightRecorderEnv(t *testing.T) {
	t.Setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "abc")
	_, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu"})
	if err == nil || !strings.Contains(err.Error(), `TORCH_NCCL_TRACE_BUFFER_SIZE="abc"`) {
		t.Fatalf("invalid env accepted: %v", err)
	}
	t.Setenv("GOCOLL_TRACE_BUFFER_SIZE", "0")
	pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	if pg.FlightRecorder() != nil {
		t.Fatal("GOCOLL_TRACE_BUFFER_SIZE=0 must turn the recorder off (and win over the TORCH_ alias)")
	}
}

// TestAnalyzeFindsSkippedCollective: rank 1 skips the third allreduce; the
// analyzer points at seq 3 and names rank 1.
func TestAnalyzeFindsSkippedCollective(t *testing.T) {
	dir := t.TempDir()
	pgs := initRecorded(t, 3, FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "rank_")})
	ctx := context.Background()
	for r, pg := range pgs {
		n := 4
		if r == 1 {
			n = 2
		}
		for i := range n {
			x := tensor.New(tensor.Float32, 8)
			if r == 2 && i == 3 {
				x = tensor.New(tensor.Float32, 4) // a size mismatch, later than the skip
			}
			if _, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pg.FlightRecorder().Dump("test"); err != nil {
			t.Fatal(err)
		}
	}
	dumps, err := frtrace.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := frtrace.Analyze(dumps)
	m := rep.Mismatch
	if m == nil || m.Kind != frtrace.MissingRank || m.Seq != 3 || len(m.Ranks) != 1 || m.Ranks[0] != 1 {
		t.Fatalf("report:\n%s", rep)
	}
	want := "rank 1 never enqueued reccpu:all_reduce seq 3; ranks 0,2 did"
	if !strings.Contains(rep.String(), want) {
		t.Fatalf("report %q lacks %q", rep, want)
	}
}

func TestAnalyzeMismatches(t *testing.T) {
	dir := t.TempDir()
	pgs := initRecorded(t, 2, FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "rank_")})
	ctx := context.Background()
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 8)}
	pgs[0].Allreduce(ctx, x, backend.AllreduceOptions{})
	pgs[1].Allreduce(ctx, []*tensor.Tensor{tensor.New(tensor.Int64, 8)}, backend.AllreduceOptions{})
	pgs[0].Allreduce(ctx, x, backend.AllreduceOptions{})
	pgs[1].Broadcast(ctx, x, backend.BroadcastOptions{})
	for _, pg := range pgs {
		pg.FlightRecorder().Dump("test")
	}
	dumps, err := frtrace.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := frtrace.Analyze(dumps)
	if rep.Mismatch == nil || rep.Mismatch.Kind != frtrace.DTypeMismatch || rep.Mismatch.Seq != 1 {
		t.Fatalf("want a dtype mismatch at seq 1:\n%s", rep)
	}
	// Drop seq 1 from both dumps: the type mismatch at seq 2 shows.
	for i := range dumps {
		dumps[i].Entries = dumps[i].Entries[1:]
	}
	rep = frtrace.Analyze(dumps)
	if rep.Mismatch == nil || rep.Mismatch.Kind != frtrace.TypeMismatch || rep.Mismatch.Seq != 2 {
		t.Fatalf("want a type mismatch at seq 2:\n%s", rep)
	}
}

// TestDesyncNamesTheLateRank: rank 1 skips the third allreduce; asked about
// seq 3, rank 0's desync report names rank 1 and its last seq.
func TestDesyncNamesTheLateRank(t *testing.T) {
	pgs := initRecorded(t, 3, FlightRecorderOptions{DumpPrefix: filepath.Join(t.TempDir(), "r")})
	ctx := context.Background()
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 1)}
	for r, pg := range pgs {
		n := 3
		if r == 1 {
			n = 2
		}
		for range n {
			pg.Allreduce(ctx, x, backend.AllreduceOptions{})
		}
		pg.publishProgress(ctx)
	}
	late, detail := pgs[0].Desync(ctx, backend.OpAllreduce, 3)
	if len(late) != 1 || late[0] != 1 || detail != "rank 1 never enqueued allreduce seq 3 (last enqueued: 2); ranks 0,2 did" {
		t.Fatalf("desync: %v %q", late, detail)
	}
	late, detail = pgs[2].Desync(ctx, backend.OpAllreduce, 2)
	if len(late) != 0 || !strings.Contains(detail, "every rank enqueued allreduce seq 2") {
		t.Fatalf("desync of a matched op: %v %q", late, detail)
	}
}

// stuck is a backend whose watchdog heartbeat never moves.
type stuck struct{ recorder }

func (*stuck) Heartbeat() uint64 { return 7 }

func TestHeartbeatMonitorEndsTheProcess(t *testing.T) {
	dir := t.TempDir()
	exited := make(chan int, 1)
	pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu",
		FlightRecorder: FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "rank_")},
		Monitor:        MonitorOptions{HeartbeatTimeout: 200 * time.Millisecond, CoordCheck: 50 * time.Millisecond, Exit: func(code int) { exited <- code }}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.Background())
	// Swap in a backend whose watchdog hangs (the test hook).
	pg.mu.Lock()
	swapBackend(pg, tensor.CPU, &stuck{})
	pg.mu.Unlock()
	select {
	case code := <-exited:
		if code != 134 {
			t.Fatalf("exit code %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the monitor did not fire")
	}
	if d := readDump(t, filepath.Join(dir, "rank_0")); !strings.Contains(d.DumpReason, "heartbeat") {
		t.Fatalf("dump reason %q", d.DumpReason)
	}
	stacks, err := os.ReadFile(filepath.Join(dir, "rank_0.stacks"))
	if err != nil || !strings.Contains(string(stacks), "goroutine") {
		t.Fatalf("stacks: %v", err)
	}
}

func TestDumpAllSignalsPeers(t *testing.T) {
	dir := t.TempDir()
	st := store.NewHashStore()
	pgs := make([]*ProcessGroup, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			var err error
			pgs[r], err = Init(context.Background(), Config{Store: st, Rank: r, WorldSize: 2, Backend: "reccpu",
				FlightRecorder: FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "rank_")},
				Monitor:        MonitorOptions{CoordCheck: 50 * time.Millisecond}})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, pg := range pgs {
			pg.Close(context.Background())
		}
	}()
	if path := pgs[0].DumpAll("timeout of allreduce seq 3"); path != filepath.Join(dir, "rank_0") {
		t.Fatalf("local dump %q", path)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if raw, err := os.ReadFile(filepath.Join(dir, "rank_1")); err == nil && strings.Contains(string(raw), "peer asked: rank 0: timeout") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 1 did not dump on rank 0's signal")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCloseWhileMonitorRuns closes groups while the heartbeat monitor polls
// every millisecond: Close once held the group lock while waiting for the
// monitor, which needed that lock to list the groups.
func TestCloseWhileMonitorRuns(t *testing.T) {
	for range 100 {
		pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: "reccpu",
			FlightRecorder: FlightRecorderOptions{Entries: -1}, Monitor: MonitorOptions{CoordCheck: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		done := make(chan error, 1)
		go func() { done <- pg.Close(context.Background()) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close deadlocked with the heartbeat monitor")
		}
	}
}

// TestRefusedOpsWriteNoDump: an op refused for its arguments or as
// unsupported is the caller's error: it is recorded, with its error, but
// writes no dump; a backend's failure still does. Every dump carries the
// job (run id, the default group's uid, the same on every rank) and its
// time.
func TestRefusedOpsWriteNoDump(t *testing.T) {
	dir := t.TempDir()
	pgs := initGroups(t, 2, Config{Backend: "reccpu", Timeout: 5 * time.Second, RunID: "job-7",
		FlightRecorder: FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "trace_")}})
	ctx := context.Background()
	x := tensor.New(tensor.Float32, 4)
	// reccpu does not implement scatter (backend.Unimplemented).
	_, err := pgs[0].Scatter(ctx, []*tensor.Tensor{x}, nil, backend.ScatterOptions{RootRank: 1})
	if !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("scatter on reccpu: %v, want ErrUnsupported", err)
	}
	// Invalid: a broadcast root outside the group.
	if _, err := pgs[0].Broadcast(ctx, []*tensor.Tensor{x}, backend.BroadcastOptions{RootRank: 9}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("broadcast from rank 9: %v, want ErrInvalidArgument", err)
	}
	time.Sleep(300 * time.Millisecond) // three polls of the recorder
	if n := pgs[0].FlightRecorder().Dumps(); n != 0 {
		t.Fatalf("%d dumps after refused ops, want none", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "trace_0")); !os.IsNotExist(err) {
		t.Fatalf("dump file after refused ops: %v", err)
	}
	if _, err := pgs[0].ReduceScatterTensor(ctx, tensor.New(tensor.Float32, 2), x, backend.ReduceScatterTensorOptions{}); errors.Is(err, backend.ErrInvalidArgument) || err == nil {
		t.Fatalf("reduce_scatter_tensor: %v, want the backend's error", err)
	}
	d0 := readDump(t, filepath.Join(dir, "trace_0"))
	if !strings.HasPrefix(d0.DumpReason, "error: ") || !strings.Contains(d0.DumpReason, "plain error") {
		t.Fatalf("dump reason %q", d0.DumpReason)
	}
	var errs int
	for _, e := range d0.Entries {
		if e.Error != "" {
			errs++
		}
	}
	if errs != 2 && errs != 3 {
		t.Fatalf("%d entries with an error, want the refused ones and the failed one: %+v", errs, d0.Entries)
	}
	if _, err := pgs[1].FlightRecorder().Dump("test"); err != nil {
		t.Fatal(err)
	}
	d1 := readDump(t, filepath.Join(dir, "trace_1"))
	if d0.RunID != "job-7" || len(d0.PGUID) != 16 || d0.JobID() != d1.JobID() || d0.CommLibVersion != frtrace.Producer {
		t.Fatalf("job ids: rank 0 %q (%s), rank 1 %q", d0.JobID(), d0.CommLibVersion, d1.JobID())
	}
	if ts, err := time.Parse(time.RFC3339Nano, d0.DumpTime); err != nil || ts.UnixNano() != d0.DumpTimeNs {
		t.Fatalf("dump_time %q (%v) vs dump_time_ns %d", d0.DumpTime, err, d0.DumpTimeNs)
	}
	// Another Init on a new store is another job, whatever the run id.
	other := initGroups(t, 1, Config{Backend: "reccpu", RunID: "job-7", FlightRecorder: FlightRecorderOptions{DumpPrefix: filepath.Join(dir, "other_")}})
	if d := other[0].FlightRecorder().Snapshot("test"); d.JobID() == d0.JobID() {
		t.Fatalf("two Inits share job id %q", d.JobID())
	}
}
