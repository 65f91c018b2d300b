package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The ops of conftest bench, in nccl-tests' names (their binaries are
// all_reduce_perf, all_gather_perf, ...).
const (
	opAllreduce     = "allreduce"
	opAllgather     = "allgather"
	opReduceScatter = "reduce_scatter"
	opBroadcast     = "broadcast"
	opReduce        = "reduce"
	opAlltoall      = "alltoall"
	opSendrecv      = "sendrecv"
)

// benchOps lists every op, in the order "--op all" runs them.
var benchOps = []string{opAllreduce, opAllgather, opReduceScatter, opBroadcast, opReduce, opAlltoall, opSendrecv}

// benchLinePrefix starts the result lines that every rank program (ours,
// the raw loops, torch, Open MPI) prints, one per rank, op and size:
//
//	BENCH2 series op rank bytes count oop_us oop_wrong ip_us ip_wrong
//
// "-" stands for a mode the program does not run (time) or did not check
// (#wrong). The launcher averages the times over ranks (nccl-tests'
// default) and adds up the wrong elements.
const benchLinePrefix = "BENCH2 "

// parseOps turns --op (comma-separated, or "all") into the op list.
func parseOps(s string) ([]string, error) {
	if s == "all" {
		return slices.Clone(benchOps), nil
	}
	var ops []string
	for _, o := range strings.Split(s, ",") {
		o = strings.TrimSpace(o)
		if !slices.Contains(benchOps, o) {
			return nil, fmt.Errorf("bad --op %q (one or more of %s, or all)", o, strings.Join(benchOps, ", "))
		}
		if !slices.Contains(ops, o) {
			ops = append(ops, o)
		}
	}
	return ops, nil
}

// busFactor is nccl-tests' bus bandwidth factor (its doc/PERFORMANCE.md):
// busbw = algbw × factor, which makes the figures of different ops and
// world sizes comparable with the hardware's peak.
func busFactor(op string, n int) float64 {
	nf := float64(n)
	switch op {
	case opAllreduce:
		return 2 * (nf - 1) / nf
	case opAllgather, opReduceScatter, opAlltoall:
		return (nf - 1) / nf
	}
	return 1 // broadcast, reduce, sendrecv
}

// opRedop and opRoot are the table's redop and root columns.
func opRedop(op string) string {
	switch op {
	case opAllreduce, opReduceScatter, opReduce:
		return "sum"
	}
	return "none"
}

func opRoot(op string) int {
	if op == opBroadcast || op == opReduce {
		return 0
	}
	return -1
}

// opCount is the element count of a size as nccl-tests counts it: the
// bytes of the largest buffer (allgather's output, reduce_scatter's
// input, alltoall's per-rank buffer) over 4 (float), rounded down to a
// multiple of n where the op splits the buffer over the ranks. Zero means
// the size is too small for n ranks and is skipped.
func opCount(op string, bytes, n int) int {
	c := bytes / 4
	switch op {
	case opAllgather, opReduceScatter, opAlltoall:
		c -= c % n
	}
	return c
}

// benchResult is one mode (out-of-place or in-place) of one row.
type benchResult struct {
	TimeUS float64 `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbs"`
	BusBW  float64 `json:"busbw_gbs"`
	// Wrong is the number of wrong elements over all ranks; nil when the
	// run did not check (-c 0).
	Wrong *int64 `json:"wrong,omitempty"`
}

// benchRow is one size of a series. A nil mode is one the series does
// not run (c10d's allreduce, broadcast and reduce are in place only; its
// alltoall and send/recv out of place only).
type benchRow struct {
	Bytes int64        `json:"bytes"`
	Count int64        `json:"count"`
	Type  string       `json:"type"`
	Redop string       `json:"redop"`
	Root  int          `json:"root"`
	OOP   *benchResult `json:"out_of_place,omitempty"`
	IP    *benchResult `json:"in_place,omitempty"`
}

// benchSeriesResult is one program's rows: ours first, then the peers.
type benchSeriesResult struct {
	Name string     `json:"name"`
	Rows []benchRow `json:"rows"`
}

// benchReport is one table: one op at one world size.
type benchReport struct {
	Op      string `json:"op"`
	Backend string `json:"backend"`
	NProc   int    `json:"nproc"`
	Iters   int    `json:"iters"` // -n; 0: the adaptive count of the older bench
	Warmup  int    `json:"warmup"`
	Check   bool   `json:"check"`
	// Repeat is --repeat: each size keeps its fastest of that many
	// interleaved runs.
	Repeat int                 `json:"repeat"`
	Series []benchSeriesResult `json:"series"`
	// BySize is --by-size: the series took turns one size at a time, and
	// Turns holds every turn's time (bench_turns.go).
	BySize bool        `json:"by_size,omitempty"`
	Turns  []benchTurn `json:"turns,omitempty"`
	// Machine is the machine section's lines (GPUs, driver and NCCL
	// from NVML, or why there are none: gpus.go's printMachine).
	Machine json.RawMessage `json:"machine,omitempty"`
}

// benchFile is what --json writes and `bench plot` reads.
type benchFile struct {
	Date    string        `json:"date"`
	Host    string        `json:"host"`
	Command []string      `json:"command"`
	Note    string        `json:"note,omitempty"`
	Reports []benchReport `json:"reports"`
}

// wrongTotal adds up the wrong elements of every series of the report.
func (r *benchReport) wrongTotal() int64 {
	var n int64
	for _, s := range r.Series {
		for _, row := range s.Rows {
			for _, m := range []*benchResult{row.OOP, row.IP} {
				if m != nil && m.Wrong != nil {
					n += *m.Wrong
				}
			}
		}
	}
	return n
}

// benchSample is one parsed result line.
type benchSample struct {
	series, op    string
	rank          int
	bytes, count  int64
	oopUS, ipUS   float64 // NaN: mode not run
	oopWr, ipWr   int64   // -1: not checked
	legacy        bool    // an older "BENCH bytes us" line (in-place allreduce, rank 0's max)
	legacyDefault string
}

// parseBenchLine parses one line of a rank program's output: a BENCH2
// line, or an older "BENCH bytes microseconds" line (the raw libucc loop
// prints those), which becomes an in-place allreduce of series def.
func parseBenchLine(line, def string) (benchSample, bool, error) {
	switch {
	case strings.HasPrefix(line, benchLinePrefix):
		f := strings.Fields(line)[1:]
		if len(f) != 9 {
			return benchSample{}, false, fmt.Errorf("bad result line %q: want 9 fields after BENCH2", line)
		}
		s := benchSample{series: f[0], op: f[1]}
		var err error
		if s.rank, err = strconv.Atoi(f[2]); err != nil {
			return s, false, fmt.Errorf("bad rank in %q: %w", line, err)
		}
		if s.bytes, err = strconv.ParseInt(f[3], 10, 64); err != nil {
			return s, false, fmt.Errorf("bad bytes in %q: %w", line, err)
		}
		if s.count, err = strconv.ParseInt(f[4], 10, 64); err != nil {
			return s, false, fmt.Errorf("bad count in %q: %w", line, err)
		}
		if s.oopUS, s.oopWr, err = parseMode(f[5], f[6]); err != nil {
			return s, false, fmt.Errorf("bad out-of-place fields in %q: %w", line, err)
		}
		if s.ipUS, s.ipWr, err = parseMode(f[7], f[8]); err != nil {
			return s, false, fmt.Errorf("bad in-place fields in %q: %w", line, err)
		}
		return s, true, nil
	case strings.HasPrefix(line, benchPrefix):
		f := strings.Fields(strings.TrimPrefix(line, benchPrefix))
		if len(f) != 2 {
			return benchSample{}, false, nil
		}
		b, err1 := strconv.ParseInt(f[0], 10, 64)
		us, err2 := strconv.ParseFloat(f[1], 64)
		if err := errors.Join(err1, err2); err != nil {
			return benchSample{}, false, fmt.Errorf("bad result line %q: %w", line, err)
		}
		return benchSample{series: def, op: opAllreduce, bytes: b, count: b / 4, oopUS: math.NaN(), ipUS: us, oopWr: -1, ipWr: -1, legacy: true}, true, nil
	}
	return benchSample{}, false, nil
}

func parseMode(t, w string) (float64, int64, error) {
	us, wr := math.NaN(), int64(-1)
	if t != "-" {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return 0, 0, err
		}
		us = v
	}
	if w != "-" {
		v, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		wr = v
	}
	return us, wr, nil
}

// formatBenchLine is parseBenchLine's inverse for BENCH2 lines.
func formatBenchLine(series, op string, rank int, bytes, count int64, oopUS float64, oopWr int64, ipUS float64, ipWr int64) string {
	t := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	w := func(v int64) string {
		if v < 0 {
			return "-"
		}
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprintf("%s%s %s %d %d %d %s %s %s %s", benchLinePrefix, series, op, rank, bytes, count, t(oopUS), w(oopWr), t(ipUS), w(ipWr))
}

// sampleKey groups the lines of one series, op and size.
type sampleKey struct {
	series, op string
	bytes      int64
}

// aggregate turns one run's lines into rows per series and op: times
// averaged over the ranks that reported, wrong elements added up.
func aggregate(samples []benchSample, n int) map[sampleKey]benchRow {
	type acc struct {
		count                 int64
		oopSum, ipSum         float64
		oopN, ipN             int
		oopWr, ipWr           int64
		oopChecked, ipChecked bool
	}
	accs := map[sampleKey]*acc{}
	for _, s := range samples {
		k := sampleKey{s.series, s.op, s.bytes}
		a := accs[k]
		if a == nil {
			a = &acc{count: s.count}
			accs[k] = a
		}
		if !math.IsNaN(s.oopUS) {
			a.oopSum += s.oopUS
			a.oopN++
		}
		if !math.IsNaN(s.ipUS) {
			a.ipSum += s.ipUS
			a.ipN++
		}
		if s.oopWr >= 0 {
			a.oopWr += s.oopWr
			a.oopChecked = true
		}
		if s.ipWr >= 0 {
			a.ipWr += s.ipWr
			a.ipChecked = true
		}
	}
	out := map[sampleKey]benchRow{}
	for k, a := range accs {
		row := benchRow{Bytes: k.bytes, Count: a.count, Type: "float", Redop: opRedop(k.op), Root: opRoot(k.op)}
		if a.oopN > 0 {
			row.OOP = newResult(k.op, n, k.bytes, a.oopSum/float64(a.oopN), a.oopWr, a.oopChecked)
		}
		if a.ipN > 0 {
			row.IP = newResult(k.op, n, k.bytes, a.ipSum/float64(a.ipN), a.ipWr, a.ipChecked)
		}
		out[k] = row
	}
	return out
}

// newResult computes the bandwidths: algbw = bytes / time (GB/s, 1e9),
// busbw = algbw × busFactor, as nccl-tests does.
func newResult(op string, n int, bytes int64, us float64, wrong int64, checked bool) *benchResult {
	r := &benchResult{TimeUS: us}
	if us > 0 {
		r.AlgBW = float64(bytes) / us / 1e3
		r.BusBW = r.AlgBW * busFactor(op, n)
	}
	if checked {
		r.Wrong = &wrong
	}
	return r
}

// faster keeps, mode by mode, the faster of two rows of the same size
// (--repeat); wrong elements add up, so a wrong result in any run shows.
func faster(have, got benchRow) benchRow {
	pick := func(a, b *benchResult) *benchResult {
		switch {
		case a == nil:
			return b
		case b == nil:
			return a
		}
		r := *a
		if b.TimeUS < a.TimeUS {
			r = *b
		}
		if a.Wrong != nil || b.Wrong != nil {
			var w int64
			for _, x := range []*benchResult{a, b} {
				if x.Wrong != nil {
					w += *x.Wrong
				}
			}
			r.Wrong = &w
		}
		return &r
	}
	have.OOP = pick(have.OOP, got.OOP)
	have.IP = pick(have.IP, got.IP)
	return have
}

// writeTable prints the report as nccl-tests prints its table (same
// columns, units and "N/A" for what was not run), then each peer's time
// beside ours and the ratio peer / ours (above 1: ours is faster).
func writeTable(w io.Writer, r *benchReport) {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	ours := r.Series[0]
	peers := r.Series[1:]
	warm := strconv.Itoa(r.Warmup)
	if r.Iters == 0 {
		warm = "adaptive" // a tenth of the adaptive count
	}
	fmt.Fprintf(bw, "#\n# %s, %s, %d ranks, float; -n %s -w %s -c %d", r.Op, ours.Name, r.NProc, itersText(r.Iters), warm, b2i(r.Check))
	switch {
	case r.BySize:
		fmt.Fprintf(bw, "; fastest of %d turns per size (the turns table below has each)", r.Repeat)
	case r.Repeat > 1:
		fmt.Fprintf(bw, "; fastest of %d interleaved runs", r.Repeat)
	}
	fmt.Fprintf(bw, "\n# time: per op, iterations queued back to back, one sync at the end, mean over ranks\n#\n")
	line := func(cols ...string) {
		fmt.Fprintln(bw, strings.TrimRight(strings.Join(cols, ""), " "))
	}
	var h1, h2, h3 []string
	h1 = append(h1, fmt.Sprintf("#%61s", ""), fmt.Sprintf("%-40s", "out-of-place"), fmt.Sprintf("%-38s", "in-place"))
	h2 = append(h2, fmt.Sprintf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root"), modeHead("time", "algbw", "busbw", "#wrong"), modeHead("time", "algbw", "busbw", "#wrong"))
	h3 = append(h3, fmt.Sprintf("#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", ""), modeHead("(us)", "(GB/s)", "(GB/s)", ""), modeHead("(us)", "(GB/s)", "(GB/s)", ""))
	for _, p := range peers {
		h1 = append(h1, fmt.Sprintf("  %-30s", p.Name))
		h2 = append(h2, fmt.Sprintf("  %9s %5s %9s %5s", "oop", "x", "ip", "x"))
		h3 = append(h3, fmt.Sprintf("  %9s %5s %9s %5s", "(us)", "", "(us)", ""))
		if p.Name == rawName {
			h1 = append(h1, fmt.Sprintf("  %-15s", "ours - raw"))
			h2 = append(h2, fmt.Sprintf("  %7s %7s", "cost", "cost"))
			h3 = append(h3, fmt.Sprintf("  %7s %7s", "(us)", "(%)"))
		}
	}
	line(h1...)
	line(h2...)
	line(h3...)
	peerRows := make([]map[int64]benchRow, len(peers))
	for i, p := range peers {
		peerRows[i] = map[int64]benchRow{}
		for _, row := range p.Rows {
			peerRows[i][row.Bytes] = row
		}
	}
	var sumBus float64
	var nBus int
	var goals []string
	for _, row := range ours.Rows {
		cols := []string{fmt.Sprintf("%12d  %12d  %8s  %6s  %6d", row.Bytes, row.Count, row.Type, row.Redop, row.Root), modeCols(row.OOP), modeCols(row.IP)}
		for _, m := range []*benchResult{row.OOP, row.IP} {
			if m != nil {
				sumBus += m.BusBW
				nBus++
			}
		}
		for i, p := range peers {
			pr, ok := peerRows[i][row.Bytes]
			if !ok {
				cols = append(cols, fmt.Sprintf("  %9s %5s %9s %5s", "-", "-", "-", "-"))
			} else {
				cols = append(cols, "  "+peerCols(pr.OOP, row.OOP)+" "+peerCols(pr.IP, row.IP))
			}
			if p.Name == rawName {
				c, g := rawCost(row, pr, ok)
				cols = append(cols, c)
				if g != "" {
					goals = append(goals, g)
				}
			}
		}
		line(cols...)
	}
	if r.Check {
		fmt.Fprintf(bw, "# #wrong (all series): %d\n", r.wrongTotal())
	} else {
		fmt.Fprintln(bw, "# #wrong: not checked (-c 1 checks)")
	}
	if nBus > 0 {
		fmt.Fprintf(bw, "# Avg bus bandwidth (%s): %.4g GB/s\n", ours.Name, sumBus/float64(nBus))
	}
	if r.BySize {
		return // the goals read the turns' medians (writeTurns), not the fastest runs
	}
	for _, g := range goals {
		fmt.Fprintln(bw, "goal:", g)
	}
}

func itersText(n int) string {
	if n == 0 {
		return "adaptive"
	}
	return strconv.Itoa(n)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func modeHead(a, b, c, d string) string {
	return fmt.Sprintf("  %9s  %9s  %9s  %6s", a, b, c, d)
}

func modeCols(m *benchResult) string {
	if m == nil {
		return modeHead("N/A", "N/A", "N/A", "N/A")
	}
	wr := "N/A"
	if m.Wrong != nil {
		wr = strconv.FormatInt(*m.Wrong, 10)
	}
	return fmt.Sprintf("  %9.2f  %9.2f  %9.2f  %6s", m.TimeUS, m.AlgBW, m.BusBW, wr)
}

// peerCols is a peer's time for one mode and the ratio to ours.
func peerCols(p, ours *benchResult) string {
	if p == nil {
		return fmt.Sprintf("%9s %5s", "-", "-")
	}
	ratio := "-"
	if ours != nil && ours.TimeUS > 0 {
		ratio = fmt.Sprintf("%.2f", p.TimeUS/ours.TimeUS)
	}
	t := fmt.Sprintf("%.2f", p.TimeUS)
	if p.Wrong != nil && *p.Wrong != 0 {
		t += "!" // the peer's result was wrong too: its #wrong is in the JSON
	}
	return fmt.Sprintf("%9s %5s", t, ratio)
}

// rawCost is the backend's cost over the raw libucc loop (in-place
// allreduce), and the goal of issue 12 that the size falls under: ≤ 1 µs
// at 8 B, ≤ 5 % from 1 MiB.
func rawCost(ours, raw benchRow, ok bool) (string, string) {
	if !ok || ours.IP == nil || raw.IP == nil || raw.IP.TimeUS <= 0 {
		return fmt.Sprintf("  %7s %7s", "-", "-"), ""
	}
	cost := ours.IP.TimeUS - raw.IP.TimeUS
	pct := 100 * cost / raw.IP.TimeUS
	var goal string
	switch {
	case ours.Bytes <= 8:
		goal = fmt.Sprintf("%d B: %+.2f µs over raw libucc (goal <= 1 µs): %s", ours.Bytes, cost, metOrMissed(cost <= 1))
	case ours.Bytes >= 1<<20:
		goal = fmt.Sprintf("%d B: %+.1f%% over raw libucc (goal <= 5%%): %s", ours.Bytes, pct, metOrMissed(pct <= 5))
	}
	return fmt.Sprintf("  %+7.2f %+6.1f%%", cost, pct), goal
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// writeJSON writes f to path (indented, so that diffs of committed runs
// read well).
func writeJSON(path string, f *benchFile) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

// readJSON reads a file that --json wrote.
func readJSON(path string) (*benchFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f benchFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: not a conftest bench --json file: %w", path, err)
	}
	if len(f.Reports) == 0 {
		return nil, fmt.Errorf("%s: no reports (not a conftest bench --json file?)", path)
	}
	return &f, nil
}
