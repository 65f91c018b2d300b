package main

import (
	"encoding/json"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestOverlapRatio(t *testing.T) {
	for _, c := range []struct{ gemm, ar, both, want float64 }{
		{10, 2, 10, 1},    // the allreduce hidden entirely
		{10, 2, 12, 0},    // serial
		{10, 2, 11, 0.5},  // half hidden
		{10, 2, 13, -0.5}, // worse than serial (a killer's stall)
		{1.38, 0.113, 1.433, (1.38 + 0.113 - 1.433) / 0.113}, // the seed's torch run, rank 0
		{2, 10, 10, 1}, // min picks the GEMM when it is the shorter
	} {
		got, err := overlapRatio(c.gemm, c.ar, c.both)
		if err != nil || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("overlapRatio(%g, %g, %g) = %g, %v; want %g", c.gemm, c.ar, c.both, got, err, c.want)
		}
	}
	for _, c := range [][3]float64{{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-1, 1, 1}, {math.NaN(), 1, 1}, {math.Inf(1), 1, 1}} {
		if _, err := overlapRatio(c[0], c[1], c[2]); err == nil {
			t.Errorf("overlapRatio(%v) accepted", c)
		}
	}
}

func TestOverlapFlags(t *testing.T) {
	f, err := parseOverlapFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.killers, []string{"none", "item", "early_wait", "sync", "frag"}) || f.nproc != 1 || f.sizeMB != 25 || f.gemm != 8192 {
		t.Errorf("defaults: %+v", f)
	}
	f, err = parseOverlapFlags([]string{"--killer", "sync, none,sync", "--high-priority", "--max-ctas", "4", "--min-ctas", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.killers, []string{"sync", "none"}) || !f.highPriority || f.minCTAs != 2 || f.maxCTAs != 4 {
		t.Errorf("parsed: %+v", f)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--killer", "oom"}, `unknown killer "oom"`},
		{[]string{"--killer", ""}, `unknown killer ""`},
		{[]string{"--nproc", "0"}, "--nproc 0"},
		{[]string{"--size-mb", "0"}, "--size-mb 0"},
		{[]string{"--size-mb", "-3"}, "--size-mb -3"},
		{[]string{"--gemm", "100"}, "--gemm 100 must be a positive multiple of 16"},
		{[]string{"--gemm", "65536"}, "--gemm 65536 is above 32768"},
		{[]string{"--iters", "0"}, "--iters 0"},
		{[]string{"--warmup", "-1"}, "--warmup -1"},
		{[]string{"--min-ctas", "-1"}, "must not be negative"},
		{[]string{"--min-ctas", "8", "--max-ctas", "4"}, "--min-ctas 8 is above --max-ctas 4"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "no-such-flag"},
	} {
		_, err := parseOverlapFlags(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

// TestOverlapHelp: --help explains every killer and says what the figure
// means at one rank.
func TestOverlapHelp(t *testing.T) {
	var sb strings.Builder
	if _, err := parseOverlapFlags([]string{"--help"}, &sb); err == nil {
		t.Fatal("--help returned no error (flag.ErrHelp)")
	}
	for _, k := range killerNames() {
		if !strings.Contains(sb.String(), "\n  "+k+" ") {
			t.Errorf("help does not explain killer %s:\n%s", k, sb.String())
		}
	}
	if !strings.Contains(sb.String(), "means little") {
		t.Error("help does not say the one-rank overlap figure means little")
	}
}

func TestOverlapOrder(t *testing.T) {
	for _, c := range []struct {
		g0, g1, a0, a1 float64
		want           string
	}{
		{0, 10, 1, 3, "overlapped"},
		{5, 10, 0, 6, "overlapped"},
		{3, 10, 0, 3, "serial (gemm after ar)"}, // adjacent is serial
		{0, 3, 3, 5, "serial (ar after gemm)"},
	} {
		if got := overlapOrder(c.g0, c.g1, c.a0, c.a1); got != c.want {
			t.Errorf("overlapOrder(%v) = %q, want %q", c, got, c.want)
		}
	}
}

// TestTraceJSON: the trace is Chrome-trace JSON that a viewer reads: named
// tracks (thread_name metadata), complete events on them with their times;
// a broken span is refused, not written.
func TestTraceJSON(t *testing.T) {
	tf := &traceFile{rank: 1, tracks: []string{"current stream (GEMM)", "NCCL internal stream (all_reduce)", "host"},
		spans: []span{{track: 0, name: "gemm", start: 10, dur: 1380}, {track: 1, name: "all_reduce", start: 12.5, dur: 113, args: map[string]any{"bytes": 4}},
			{track: 2, name: "wait", start: 20, dur: 0.3}},
		meta: map[string]any{"killer": "none"}}
	b, err := tf.marshal()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   *float64       `json:"ts"`
			Dur  float64        `json:"dur"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
		DisplayTimeUnit string         `json:"displayTimeUnit"`
		OtherData       map[string]any `json:"otherData"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	names := map[int]string{}
	var xs []string
	for _, e := range got.TraceEvents {
		if e.Pid != 1 {
			t.Errorf("event %q in process %d, want the rank, 1", e.Name, e.Pid)
		}
		switch e.Ph {
		case "M":
			if e.Name == "thread_name" {
				names[e.Tid], _ = e.Args["name"].(string)
			}
		case "X":
			if e.Ts == nil {
				t.Errorf("complete event %q has no ts", e.Name)
			}
			xs = append(xs, names[e.Tid]+"/"+e.Name)
		default:
			t.Errorf("event %q has phase %q", e.Name, e.Ph)
		}
	}
	want := []string{"current stream (GEMM)/gemm", "NCCL internal stream (all_reduce)/all_reduce", "host/wait"}
	if !slices.Equal(xs, want) {
		t.Errorf("complete events %v, want %v", xs, want)
	}
	if got.OtherData["killer"] != "none" || got.DisplayTimeUnit != "ms" {
		t.Errorf("otherData %v, displayTimeUnit %q", got.OtherData, got.DisplayTimeUnit)
	}
	for _, bad := range []span{{track: 3, name: "x"}, {track: -1, name: "x"}, {track: 0, name: "x", dur: -1}, {track: 0, name: "x", start: math.NaN()}} {
		tf := &traceFile{tracks: []string{"a"}, spans: []span{bad}}
		if _, err := tf.marshal(); err == nil {
			t.Errorf("span %+v accepted", bad)
		}
	}
}

func TestHostCostTable(t *testing.T) {
	f := &hcFlags{reps: 3}
	var samples []hcSample
	for r, w := range []float64{300, 200, 250} {
		samples = append(samples, hcSample{Mode: hcRawMode, Round: r, WallNs: w, CPUNs: w})
		samples = append(samples, hcSample{Mode: hcGoalMode, Round: r, WallNs: w + 900, CPUNs: w + 800})
		samples = append(samples, hcSample{Mode: "torch nccl async", Round: r, WallNs: 25000, CPUNs: 24000})
	}
	st := hostCostStats(samples)
	if len(st) != 3 || st[0].mode != hcRawMode || st[0].wall != 250 || st[0].wallMin != 200 || st[0].wallMax != 300 || st[0].rounds != 3 {
		t.Fatalf("stats %+v", st)
	}
	out := hostCostTable("test", f, samples)
	for _, want := range []string{"| " + hcGoalMode + " | 3 | 1150 | 1100-1200 | 1050 | +0.90 | 0.046 |", "goal: " + hcGoalMode + " is 0.90 µs over NCCL's own call", ": met"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for r := 3; r < 6; r++ {
		samples = append(samples, hcSample{Mode: hcGoalMode, Round: r, WallNs: 5000})
	}
	// Goal medians 5000 over 6 rounds (1100 1150 1200 5000 5000 5000: 3100), raw 250.
	if out := hostCostTable("test", f, samples); !strings.Contains(out, "is 2.85 µs over") || !strings.Contains(out, ": missed") {
		t.Errorf("a 2.85 µs excess is not a miss:\n%s", out)
	}
}

func TestGemmGaps(t *testing.T) {
	got := gemmGaps([][2]float64{{0, 10}, {12, 20}, {20, 30}, {5030, 6000}})
	if !slices.Equal(got, []float64{2, 0, 5000}) {
		t.Errorf("gemmGaps = %v", got)
	}
	if g := gemmGaps([][2]float64{{0, 1}}); len(g) != 0 {
		t.Errorf("one GEMM has gaps %v", g)
	}
}
