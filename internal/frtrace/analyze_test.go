package frtrace

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func entry(seq uint64, name, state string, size int) Entry {
	return Entry{PGID: "0", CollectiveSeqID: seq, ProfilingName: name, State: state,
		InputSizes: [][]int{{size}}, InputDtypes: []string{"float32"}}
}

func dump(rank int, es ...Entry) Dump {
	return Dump{Version: Version, Rank: rank, WorldSize: 2,
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
