package main

import (
	"bytes"
	"math"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestTurnOrder: ours first in odd turns (t = 0, 2, ...), last in even.
func TestTurnOrder(t *testing.T) {
	if got := turnOrder(3, 0); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Errorf("turn 1: %v", got)
	}
	if got := turnOrder(3, 1); !reflect.DeepEqual(got, []int{1, 2, 0}) {
		t.Errorf("turn 2: %v", got)
	}
	if got := turnOrder(1, 1); !reflect.DeepEqual(got, []int{0}) {
		t.Errorf("one series: %v", got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of none is not NaN")
	}
}

// TestWriteTurns: the turns table pairs ours and the peer turn by turn
// (a turn one side lacks is left out), and the goal lines read the
// medians: the difference at 8 B, the ratio from 1 MiB.
func TestWriteTurns(t *testing.T) {
	r := &benchReport{Op: opAllreduce, Backend: "ucc", NProc: 2, Repeat: 4, BySize: true,
		Series: []benchSeriesResult{{Name: "ucc", Rows: []benchRow{{Bytes: 8}, {Bytes: 1 << 20}}}, {Name: rawName}}}
	add := func(series string, bytes int64, times ...float64) {
		for i, us := range times {
			if us > 0 {
				r.Turns = append(r.Turns, benchTurn{Series: series, Op: opAllreduce, Bytes: bytes, Turn: i + 1, TimeUS: us, InPlace: true})
			}
		}
	}
	// 8 B: differences 0.5, 2.0, 0.8, 0.9 µs: median 0.85 (met); the
	// fastest-run rule would say 1.5 - 1.0.
	add("ucc", 8, 1.5, 3.0, 1.8, 1.9)
	add(rawName, 8, 1.0, 1.0, 1.0, 1.0)
	// 1 MiB: turn 3 of the raw loop missing; ratios 1.10, 1.02, 1.04:
	// median 1.04 (met), where the medians of the times (210 / 200) say
	// +5 %.
	add("ucc", 1<<20, 220, 204, 999, 208)
	add(rawName, 1<<20, 200, 200, 0, 200)
	var b bytes.Buffer
	writeTurns(&b, r)
	out := b.String()
	for _, want := range []string{
		"# turns: ucc against raw-ucc, allreduce, 2 ranks; per size 4 turns",
		"goal: 8 B: median +0.85 µs over raw libucc in 4 turns, 3 within (goal <= 1 µs): met",
		"goal: 1048576 B: median +4.0% over raw libucc in 3 turns, 2 within (goal <= 5%): met",
		"1.100 1.020 1.040",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	r.BySize = false
	b.Reset()
	writeTurns(&b, r)
	if b.Len() != 0 {
		t.Errorf("a report without --by-size printed turns:\n%s", b.String())
	}
}

// TestBenchBySize runs the command with --by-size: every series gets one
// launch per size and turn, and the JSON holds every turn.
func TestBenchBySize(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	if _, err := exec.LookPath("mpicc"); err != nil {
		t.Skip("no mpicc: the Open MPI peer is the one peer of cpupool that needs no sid root")
	}
	path := filepath.Join(t.TempDir(), "out.json")
	table := benchQuiet(t, []string{"--backend", "cpupool", "--sizes", "8,4K", "--nproc", "2", "-n", "3", "-w", "1", "--peers", mpiName,
		"--by-size", "--repeat", "2", "--json", path})
	f, err := readJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Reports) != 1 || !f.Reports[0].BySize {
		t.Fatalf("reports %+v", f.Reports)
	}
	got := map[string]int{}
	for _, tu := range f.Reports[0].Turns {
		got[tu.Series]++
		if tu.TimeUS <= 0 || tu.Turn < 1 || tu.Turn > 2 || (tu.Bytes != 8 && tu.Bytes != 4096) {
			t.Errorf("turn %+v", tu)
		}
	}
	if got["cpupool"] != 4 || got[mpiName] != 4 {
		t.Errorf("turns per series %v, want 4 each (2 sizes, 2 turns)\n%s", got, table)
	}
	if !strings.Contains(table, "# turns: cpupool against openmpi") {
		t.Errorf("no turns table:\n%s", table)
	}
}
