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
	for r, n := range last {
		d := frtrace.Dump{Version: frtrace.Version, Rank: r, WorldSize: len(last),
			PGConfig: map[string]frtrace.PGConfig{"0": {Name: "0", Desc: "default_pg", Ranks: []int{0, 1}}}}
		for s := uint64(1); s <= n; s++ {
			d.Entries = append(d.Entries, frtrace.Entry{RecordID: s - 1, PGID: "0", ProcessGroup: [2]string{"0", "default_pg"},
				CollectiveSeqID: s, ProfilingName: "nccl:all_reduce", InputSizes: [][]int{{4}}, InputDtypes: []string{"Float"},
				OutputSizes: [][]int{{4}}, OutputDtypes: []string{"Float"}, State: frtrace.StateCompleted})
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "gocoll_trace_rank_"+strconv.Itoa(r)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFRAnalyze(t *testing.T) {
	var out strings.Builder
	code, err := frAnalyze(&out, writeDumps(t, []uint64{3, 3}))
	if code != 0 || err != nil || !strings.Contains(out.String(), "all collectives matched") {
		t.Fatalf("matching dumps: code %d, err %v, output %q", code, err, out.String())
	}
	out.Reset()
	code, err = frAnalyze(&out, writeDumps(t, []uint64{3, 2}))
	if code != 1 || !errors.Is(err, errMismatch) || !strings.Contains(out.String(), frtrace.MissingRank) || !strings.Contains(out.String(), "3") {
		t.Fatalf("rank 1 missing seq 3: code %d, err %v, output %q", code, err, out.String())
	}
	t.Log(out.String())
	if code, _ := fr([]string{"analyze"}); code != 2 {
		t.Fatalf("usage error: code %d", code)
	}
	if code, _ := frAnalyze(&out, t.TempDir()); code != 2 {
		t.Fatalf("empty dir: code %d", code)
	}
}
