package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/internal/frtrace"
)

// writeDumps writes a dump per rank; rank r has allreduces 1..last[r].
func writeDumps(t *testing.T, last []uint64) string {
	dir := t.TempDir()
	writeRun(t, dir, "", "run1", "nccl:all_reduce", 1000, last)
	return dir
}

// writeRun writes the dumps of one run into dir, one per rank, named
// name+"rank_"+r; rank r has collectives 1..last[r] of op.
func writeRun(t *testing.T, dir, name, run, op string, at int64, last []uint64) {
	for r, n := range last {
		d := frtrace.Dump{Version: frtrace.Version, CommLibVersion: frtrace.Producer, Rank: r, WorldSize: len(last),
			RunID: run, PGUID: "uid-" + run, DumpTimeNs: at + int64(r),
			PGConfig: map[string]frtrace.PGConfig{"0": {Name: "0", Desc: "default_pg", Ranks: []int{0, 1}}}}
		for s := uint64(1); s <= n; s++ {
			d.Entries = append(d.Entries, frtrace.Entry{RecordID: s - 1, PGID: "0", ProcessGroup: [2]string{"0", "default_pg"},
				CollectiveSeqID: s, ProfilingName: op, InputSizes: [][]int{{4}}, InputDtypes: []string{"Float"},
				OutputSizes: [][]int{{4}}, OutputDtypes: []string{"Float"}, State: frtrace.StateCompleted})
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+"gocoll_trace_rank_"+strconv.Itoa(r)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFRAnalyze(t *testing.T) {
	var out strings.Builder
	code, err := frAnalyze(&out, writeDumps(t, []uint64{3, 3}), "")
	if code != 0 || err != nil || !strings.Contains(out.String(), "all collectives matched") {
		t.Fatalf("matching dumps: code %d, err %v, output %q", code, err, out.String())
	}
	out.Reset()
	code, err = frAnalyze(&out, writeDumps(t, []uint64{3, 2}), "")
	if code != 1 || !errors.Is(err, errMismatch) || !strings.Contains(out.String(), frtrace.MissingRank) || !strings.Contains(out.String(), "3") {
		t.Fatalf("rank 1 missing seq 3: code %d, err %v, output %q", code, err, out.String())
	}
	t.Log(out.String())
	if code, _ := fr([]string{"analyze"}); code != 2 {
		t.Fatalf("usage error: code %d", code)
	}
	if code, _ := frAnalyze(&out, t.TempDir(), ""); code != 2 {
		t.Fatalf("empty dir: code %d", code)
	}
}

// TestFRAnalyzeOtherRuns is the /tmp case of issue 15: a stale run's dumps
// (of other ranks, with other ops) and other files beside the newest run's.
// Analyze reads the newest run alone, says what it left out, and finds no
// false mismatch; --job picks the old run.
func TestFRAnalyzeOtherRuns(t *testing.T) {
	dir := t.TempDir()
	writeRun(t, dir, "old_", "old", "gloo:broadcast", 10, []uint64{2, 2, 2})
	writeRun(t, dir, "old_again_", "old", "gloo:broadcast", 20, []uint64{2})
	writeRun(t, dir, "", "new", "gloo:all_reduce", 1000, []uint64{3, 3})
	if err := os.WriteFile(filepath.Join(dir, "pytorch_notes.json"), []byte(`{"version":"2.10","pg_config":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	code, err := frAnalyze(&out, dir, "")
	t.Log(out.String())
	for _, want := range []string{"job run new, pg_uid uid-new: dumps of ranks [0 1]", "also holds dumps of 1 other run, left out: run old, pg_uid uid-old (ranks [0 1 2]",
		"skipped 1 file (not gocoll", "all collectives matched"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 0 || err != nil {
		t.Fatalf("code %d, err %v", code, err)
	}
	out.Reset()
	code, err = frAnalyze(&out, dir, "old")
	t.Log(out.String())
	if code != 0 || err != nil || !strings.Contains(out.String(), "warning: rank 0 has 2 dumps in this job") {
		t.Fatalf("--job old: code %d, err %v", code, err)
	}
	if code, err := frAnalyze(&out, dir, "nosuch"); code != 2 || err == nil || !strings.Contains(err.Error(), "run new, pg_uid uid-new") {
		t.Fatalf("--job nosuch: code %d, err %v", code, err)
	}
}
