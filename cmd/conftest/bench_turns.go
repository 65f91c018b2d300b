package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"
)

// --by-size: the turns of one size at a time.
//
// Why: at 1 MiB and above the raw libucc loop alone moved 156–246 µs
// from one invocation to the next on nvidia-h200, and one series' whole
// sweep after the other's (--repeat without --by-size) put minutes between
// ours and the peer at a given size, so a ≤ 5 % difference could not be
// read. Taking turns per size puts each of ours' runs next to each peer's,
// launched the same way with the same one size, and the ratio of a turn
// compares two runs seconds apart; the order alternates (ours first in
// odd turns, last in even ones) so that a drift within the turn does not
// favour one side, and the median of the turns' ratios drops the turns
// that a neighbour's burst hit.

// benchTurn is one series' time at one size in one turn of --by-size.
type benchTurn struct {
	Series  string  `json:"series"`
	Op      string  `json:"op"`
	Bytes   int64   `json:"bytes"`
	Turn    int     `json:"turn"` // from 1
	TimeUS  float64 `json:"time_us"`
	InPlace bool    `json:"in_place"` // the in-place time (else out of place, where the op has no in-place mode)
}

// turnOrder is the launch order of n series in turn t (from 0): ours
// (index 0) first, then the peers, in even t; the peers, then ours, in
// odd t.
func turnOrder(n, t int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	if t%2 == 1 {
		o = append(o[1:], 0)
	}
	return o
}

// turnsOf is one launch's rows (aggregate's) as turns of the series s
// and the ones its processes also print.
func turnsOf(rows map[sampleKey]benchRow, s benchSeries, turn int) []benchTurn {
	var out []benchTurn
	for k, row := range rows {
		if k.series != s.name && !slices.Contains(s.also, k.series) {
			continue
		}
		t := benchTurn{Series: k.series, Op: k.op, Bytes: k.bytes, Turn: turn, InPlace: row.IP != nil}
		switch {
		case row.IP != nil:
			t.TimeUS = row.IP.TimeUS
		case row.OOP != nil:
			t.TimeUS = row.OOP.TimeUS
		default:
			continue
		}
		out = append(out, t)
	}
	return out
}

// median of xs (the mean of the middle two for an even count); NaN for
// none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// pairUp is the turns of ours and of peer at bytes that both ran, in
// turn order: ours' and the peer's times.
func pairUp(turns []benchTurn, ours, peer string, bytes int64) (o, p []float64) {
	by := map[string]map[int]float64{ours: {}, peer: {}}
	for _, t := range turns {
		if t.Bytes == bytes && (t.Series == ours || t.Series == peer) {
			by[t.Series][t.Turn] = t.TimeUS
		}
	}
	var ts []int
	for t := range by[ours] {
		if _, ok := by[peer][t]; ok {
			ts = append(ts, t)
		}
	}
	slices.Sort(ts)
	for _, t := range ts {
		o, p = append(o, by[ours][t]), append(p, by[peer][t])
	}
	return o, p
}

// writeTurns prints, after the table of a --by-size report, each peer's
// turns beside ours: per size the medians of both times, each turn's
// ratio ours / peer, their median, least and greatest, and the median of
// the differences ours − peer; for the raw libucc loop the goal lines of
// issue 12 read those medians (≤ 1 µs at 8 B: the median difference; ≤
// 5 % from 1 MiB: the median ratio).
func writeTurns(w io.Writer, r *benchReport) {
	if !r.BySize || len(r.Series) == 0 {
		return
	}
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	ours := r.Series[0]
	var goals []string
	for _, p := range r.Series[1:] {
		fmt.Fprintf(bw, "#\n# turns: %s against %s, %s, %d ranks; per size %d turns of one launch each (ours first in odd turns, last in even ones)\n",
			ours.Name, p.Name, r.Op, r.NProc, r.Repeat)
		fmt.Fprintf(bw, "#%11s  %10s  %10s  %-*s  %7s  %7s  %7s  %10s\n", "size", "ours", p.Name, 6*r.Repeat, "ours / peer, turn by turn", "median", "min", "max", "ours-peer")
		fmt.Fprintf(bw, "#%11s  %10s  %10s  %-*s  %7s  %7s  %7s  %10s\n", "(B)", "(us, med)", "(us, med)", 6*r.Repeat, "", "", "", "", "(us, med)")
		for _, row := range ours.Rows {
			o, q := pairUp(r.Turns, ours.Name, p.Name, row.Bytes)
			if len(o) == 0 {
				continue
			}
			ratios := make([]float64, len(o))
			diffs := make([]float64, len(o))
			var each []string
			for i := range o {
				ratios[i], diffs[i] = o[i]/q[i], o[i]-q[i]
				each = append(each, fmt.Sprintf("%5.3f", ratios[i]))
			}
			med, diff := median(ratios), median(diffs)
			fmt.Fprintf(bw, "%12d  %10.2f  %10.2f  %-*s  %7.3f  %7.3f  %7.3f  %+10.2f\n", row.Bytes, median(o), median(q), 6*r.Repeat, strings.Join(each, " "),
				med, slices.Min(ratios), slices.Max(ratios), diff)
			if p.Name != rawName {
				continue
			}
			// within counts the turns that meet the goal on their own: a
			// median at the goal's edge reads differently with 1 of 5
			// than with 4 of 5.
			within := func(ok func(i int) bool) int {
				k := 0
				for i := range o {
					if ok(i) {
						k++
					}
				}
				return k
			}
			switch {
			case row.Bytes <= 8:
				k := within(func(i int) bool { return diffs[i] <= 1 })
				goals = append(goals, fmt.Sprintf("%d B: median %+.2f µs over raw libucc in %d turns, %d within (goal <= 1 µs): %s", row.Bytes, diff, len(o), k, metOrMissed(diff <= 1)))
			case row.Bytes >= 1<<20:
				pct := 100 * (med - 1)
				k := within(func(i int) bool { return ratios[i] <= 1.05 })
				goals = append(goals, fmt.Sprintf("%d B: median %+.1f%% over raw libucc in %d turns, %d within (goal <= 5%%): %s", row.Bytes, pct, len(o), k, metOrMissed(pct <= 5)))
			}
		}
	}
	for _, g := range goals {
		fmt.Fprintln(bw, "goal:", g)
	}
}

// cpuListRE is one taskset --cpu-list entry: a CPU or a range.
var cpuListRE = regexp.MustCompile(`^[0-9]+(-[0-9]+)?$`)

// parsePin is --pin: comma-separated CPU entries, one per rank in turn.
func parsePin(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if !cpuListRE.MatchString(e) {
			return nil, fmt.Errorf("bad --pin entry %q (a CPU number or a range such as 2-5; entries comma-separated, one per rank)", e)
		}
		out = append(out, e)
	}
	return out, nil
}
