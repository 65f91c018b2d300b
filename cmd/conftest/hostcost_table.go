package main

import (
	"fmt"
	"slices"
	"strings"
)

// hcStat is one mode's samples, summarised.
type hcStat struct {
	mode                   string
	wall, wallMin, wallMax float64
	cpu                    float64
	rounds                 int
}

// hostCostStats groups samples by mode, in first-seen order, with the
// median and range of the wall time and the median CPU time.
func hostCostStats(samples []hcSample) []hcStat {
	var order []string
	by := map[string][]hcSample{}
	for _, s := range samples {
		if _, ok := by[s.Mode]; !ok {
			order = append(order, s.Mode)
		}
		by[s.Mode] = append(by[s.Mode], s)
	}
	out := make([]hcStat, 0, len(order))
	for _, m := range order {
		var w, c []float64
		for _, s := range by[m] {
			w, c = append(w, s.WallNs), append(c, s.CPUNs)
		}
		out = append(out, hcStat{mode: m, wall: medianOf(w), wallMin: slices.Min(w), wallMax: slices.Max(w), cpu: medianOf(c), rounds: len(w)})
	}
	return out
}

// hostCostGoal is issue 16's goal: an async allreduce + Wait through the
// dispatcher, recorder on, within 1 µs of NCCL's own call.
const (
	hcGoalMode = "dispatcher async+Wait, recorder on"
	hcRawMode  = "nccl raw"
	// hcFloorMode is the CUDA calls of async + Wait from C.
	hcFloorMode = "nccl + CUDA calls"
	// hcGoalCurMode is the goal's mode with nccl.Options.AsyncOnCurrentStream,
	// and hcFloorCurMode its CUDA calls from C.
	hcGoalCurMode  = "dispatcher async+Wait, recorder on, current stream"
	hcFloorCurMode = "nccl + CUDA calls, current stream"
	// hcCrossCurMode is hcFloorCurMode's calls made from a Go loop, one
	// cgo call per op: over hcFloorCurMode, the crossing.
	hcCrossCurMode = "nccl + CUDA calls, current stream, one cgo call each"
	// hcBackendCurMode is the backend's own call in the goal's mode.
	hcBackendCurMode = "backend async+Wait, current stream"
	hcGoalNs         = 1000.0
)

// roundDeltas is, for each round in which both modes ran, mode a's wall
// time minus mode b's: the modes take turns inside a round, so the
// difference within a round is less exposed to the machine's drift than
// the difference of the medians.
func roundDeltas(samples []hcSample, a, b string) []float64 {
	at, bt := map[int]float64{}, map[int]float64{}
	for _, s := range samples {
		switch s.Mode {
		case a:
			at[s.Round] = s.WallNs
		case b:
			bt[s.Round] = s.WallNs
		}
	}
	var d []float64
	for r, v := range at {
		if w, ok := bt[r]; ok {
			d = append(d, v-w)
		}
	}
	slices.Sort(d)
	return d
}

// hostCostTable renders the stats: each mode's wall time per call (median
// and range over the rounds), its thread CPU time, its excess over NCCL's
// own call (nccl) and its ratio to torch's async + wait, then the goal.
func hostCostTable(desc string, f *hcFlags, samples []hcSample) string {
	stats := hostCostStats(samples)
	find := func(mode string) *hcStat {
		for i := range stats {
			if stats[i].mode == mode {
				return &stats[i]
			}
		}
		return nil
	}
	raw := find(hcRawMode)
	var torchAsync *hcStat
	for i := range stats {
		if strings.HasPrefix(stats[i].mode, "torch ") && strings.HasSuffix(stats[i].mode, " async") {
			torchAsync = &stats[i]
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "hostcost: %s; %d Go rounds, modes taking turns, torch between rounds; medians over rounds, [min-max]\n\n", desc, f.reps)
	sb.WriteString("| mode | rounds | wall ns/call | [min-max] | thread CPU ns/call | over nccl raw µs | / torch async+wait |\n|---|---|---|---|---|---|---|\n")
	for _, s := range stats {
		over, ratio := "", ""
		if raw != nil && !strings.HasPrefix(s.mode, "torch ") {
			over = fmt.Sprintf("%+.2f", (s.wall-raw.wall)/1e3)
		}
		if torchAsync != nil && torchAsync.wall > 0 {
			ratio = fmt.Sprintf("%.3f", s.wall/torchAsync.wall)
		}
		fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f-%.0f | %.0f | %s | %s |\n", s.mode, s.rounds, s.wall, s.wallMin, s.wallMax, s.cpu, over, ratio)
	}
	for _, gm := range [...]struct{ mode, floor string }{{hcGoalMode, hcFloorMode}, {hcGoalCurMode, hcFloorCurMode}} {
		g := find(gm.mode)
		if g == nil || raw == nil {
			continue
		}
		d := g.wall - raw.wall
		verdict := "met"
		if d > hcGoalNs {
			verdict = "missed"
		}
		fmt.Fprintf(&sb, "\ngoal: %s is %.2f µs over NCCL's own call (%.0f vs %.0f ns; goal <= %.0f µs): %s\n", gm.mode, d/1e3, g.wall, raw.wall, hcGoalNs/1e3, verdict)
		if rd := roundDeltas(samples, gm.mode, hcRawMode); len(rd) > 1 {
			fmt.Fprintf(&sb, "  round by round: %+.2f µs median, [%+.2f, %+.2f] over %d rounds\n", medianOf(rd)/1e3, rd[0]/1e3, rd[len(rd)-1]/1e3, len(rd))
		}
		if fl := find(gm.floor); fl != nil {
			fmt.Fprintf(&sb, "  of which the CUDA calls the design makes (from C): %.2f µs; Go (backend, dispatcher, recorder): %.2f µs\n", (fl.wall-raw.wall)/1e3, (g.wall-fl.wall)/1e3)
			if cr, be := find(hcCrossCurMode), find(hcBackendCurMode); gm.floor == hcFloorCurMode && cr != nil && be != nil {
				fmt.Fprintf(&sb, "  the Go, split: the cgo crossing %.2f µs, the backend's Go %.2f µs, the dispatcher and recorder %.2f µs\n",
					(cr.wall-fl.wall)/1e3, (be.wall-cr.wall)/1e3, (g.wall-be.wall)/1e3)
			}
		}
	}
	return sb.String()
}
