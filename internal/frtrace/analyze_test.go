package frtrace

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func entry(seq uint64, name, state string, size int) Entry {
	return Entry{PGID: "0", CollectiveSeqID: seq, ProfilingName: name, State: state,
		InputSizes: [][]int{{size}}, InputDtypes: []string{"float32"}}
}

func dump(rank int, es ...Entry) Dump {
	return Dump{Version: Version, CommLibVersion: Producer, Rank: rank, WorldSize: 2,
		PGConfig: map[string]PGConfig{"0": {Name: "0", Desc: "default_pg", Ranks: []int{0, 1}}}, Entries: es}
}

func TestRingBufferEdgeIsNotAMissingRank(t *testing.T) {
	// Rank 1's buffer wrapped: it no longer holds seq 1-2, which is not a
	// desync.
	d0 := dump(0, entry(1, "nccl:all_reduce", StateCompleted, 4), entry(2, "nccl:all_reduce", StateCompleted, 4), entry(3, "nccl:all_reduce", StateCompleted, 4))
	d1 := dump(1, entry(3, "nccl:all_reduce", StateCompleted, 4))
	rep := Analyze([]Dump{d0, d1})
	if rep.Mismatch != nil {
		t.Fatalf("unexpected mismatch: %s", rep)
	}
	if rep.Checked != 3 {
		t.Fatalf("checked %d", rep.Checked)
	}
}

func TestStateMismatchAndMissingDump(t *testing.T) {
	d0 := dump(0, entry(1, "gloo:broadcast", StateCompleted, 4), entry(2, "gloo:all_reduce", StateScheduled, 4))
	d1 := dump(1, entry(1, "nccl:broadcast", StateCompleted, 4), entry(2, "nccl:all_reduce", StateCompleted, 4))
	d1.PGConfig["0"] = PGConfig{Name: "0", Desc: "default_pg", Ranks: []int{0, 1, 2}}
	rep := Analyze([]Dump{d0, d1})
	m := rep.Mismatch
	if m == nil || m.Kind != StateMismatch || m.Seq != 2 || len(rep.NoDump) != 1 || rep.NoDump[0] != 2 {
		t.Fatalf("report: %s", rep)
	}
}

func TestLoadSkipsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	raw, _ := json.Marshal(dump(0, entry(1, "nccl:all_reduce", StateCompleted, 4)))
	os.WriteFile(filepath.Join(dir, "rank_0"), raw, 0o644)
	os.WriteFile(filepath.Join(dir, "rank_0.stacks"), []byte("goroutine 1 [running]:"), 0o644)
	ds, err := Load(dir)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Load: %d dumps, %v", len(ds), err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Fatal("empty dir accepted")
	}
}

// TestLoadJobs: a directory like /tmp holds other files, PyTorch's JSON,
// and an older run's dumps with a rank dumped twice; LoadJobs returns the
// newest job first and keeps the runs apart.
func TestLoadJobs(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) {
		t.Helper()
		var raw []byte
		if b, ok := v.([]byte); ok {
			raw = b
		} else {
			raw, _ = json.Marshal(v)
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	at := func(d Dump, run, uid string, ns int64) Dump {
		d.RunID, d.PGUID, d.DumpTimeNs = run, uid, ns
		return d
	}
	// The old run: ranks 0, 0 (twice), 1, 2; a broadcast where the new run
	// has an allreduce, which would be a false type mismatch if mixed.
	write("old_0", at(dump(0, entry(1, "gloo:broadcast", StateCompleted, 4)), "", "", 100))
	write("old_0_copy", at(dump(0, entry(1, "gloo:broadcast", StateCompleted, 4)), "", "", 150))
	write("old_1", at(dump(1, entry(1, "gloo:broadcast", StateCompleted, 4)), "", "", 110))
	write("old_2", at(dump(2, entry(1, "gloo:broadcast", StateCompleted, 4)), "", "", 120))
	write("new_1", at(dump(1, entry(1, "gloo:all_reduce", StateCompleted, 4)), "r1", "u1", 1000))
	write("new_0", at(dump(0, entry(1, "gloo:all_reduce", StateCompleted, 4)), "r1", "u1", 1001))
	torch := dump(0, entry(1, "nccl:all_reduce", StateCompleted, 4))
	torch.CommLibVersion = "2.21.5" // PyTorch's JSON dump: NCCL's version
	write("torch_0", torch)
	write("notes.txt", []byte("goroutine 1 [running]:"))
	write("array.json", []byte("[1,2,3]"))
	write("empty", []byte{})
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := LoadJobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Jobs) != 2 || l.Skipped != 4 {
		t.Fatalf("%d jobs, %d skipped; want 2 and 4", len(l.Jobs), l.Skipped)
	}
	newJob, old := l.Jobs[0], l.Jobs[1]
	if newJob.ID != "run r1, pg_uid u1" || !slices.Equal(newJob.Ranks(), []int{0, 1}) || len(newJob.Duplicates) != 0 {
		t.Fatalf("newest job %q ranks %v duplicates %v", newJob.ID, newJob.Ranks(), newJob.Duplicates)
	}
	if old.ID != "run -, pg_uid -" || !slices.Equal(old.Ranks(), []int{0, 1, 2}) ||
		!slices.Equal(old.Duplicates[0], []string{filepath.Join(dir, "old_0")}) || old.Dumps[0].DumpTimeNs != 150 {
		t.Fatalf("old job %q ranks %v duplicates %v", old.ID, old.Ranks(), old.Duplicates)
	}
	if rep := Analyze(newJob.Dumps); rep.Mismatch != nil || rep.Checked != 1 {
		t.Fatalf("newest job: %s", rep)
	}
	ds, err := Load(dir)
	if err != nil || len(ds) != 2 || ds[0].RunID != "r1" {
		t.Fatalf("Load: %d dumps, %v", len(ds), err)
	}
}

func TestSectionsBounded(t *testing.T) {
	RegisterSection("test-fast", func(context.Context) any { return map[string]int{"x": 1} })
	block := make(chan struct{})
	defer close(block)
	RegisterSection("test-hung", func(context.Context) any { <-block; return nil })
	defer func() {
		sections.mu.Lock()
		delete(sections.m, "test-fast")
		delete(sections.m, "test-hung")
		sections.mu.Unlock()
	}()
	// The deadline is long enough for the fast section to answer on a loaded
	// CI machine; the hung one must still give way to it. The bound below only
	// catches a collector that ignores ctx altogether.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	t0 := time.Now()
	got := CollectSections(ctx)
	if took := time.Since(t0); took > 30*time.Second {
		t.Fatalf("CollectSections took %v with a hung section", took)
	}
	if string(got["test-fast"]) != `{"x":1}` || !strings.Contains(string(got["test-hung"]), "did not answer in time") {
		t.Fatalf("sections %s / %s", got["test-fast"], got["test-hung"])
	}
}
