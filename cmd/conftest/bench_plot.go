package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// benchPlot is `conftest bench plot -o out.svg FILE...`: bus (or
// algorithm) bandwidth against size, both axes logarithmic, one line per
// series of every report in the --json files, ours and the peers'.
func benchPlot(args []string) error {
	fs := flag.NewFlagSet("conftest bench plot", flag.ExitOnError)
	out := fs.String("o", "", "output file; the extension picks the format (.svg, .png, .pdf)")
	metric := fs.String("metric", "busbw", "busbw or algbw (busbw is 0 at one rank for allreduce, allgather, reduce_scatter and alltoall)")
	mode := fs.String("mode", "auto", "out-of-place, in-place or auto (ours' out-of-place rows where it has them, else in-place)")
	title := fs.String("title", "", "plot title (default: the ops and world sizes)")
	op := fs.String("op", "", "only the reports of this op")
	width := fs.Float64("width", 8, "width in inches")
	height := fs.Float64("height", 5, "height in inches")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: conftest bench plot -o out.svg [flags] FILE[@series,...]...\n\n"+
			"FILEs are conftest bench --json files; @series,... keeps only those series of that file.\n"+
			"A series that appears in several files is labelled with its file's name.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() == 0 {
		fs.Usage()
		return errors.New("bench plot needs -o FILE and at least one --json file")
	}
	if *metric != "busbw" && *metric != "algbw" {
		return fmt.Errorf("bad --metric %q (busbw or algbw)", *metric)
	}
	if *mode != "auto" && *mode != "out-of-place" && *mode != "in-place" {
		return fmt.Errorf("bad --mode %q (out-of-place, in-place or auto)", *mode)
	}
	var files []plotFile
	for _, arg := range fs.Args() {
		path, only, _ := strings.Cut(arg, "@")
		f, err := readJSON(path)
		if err != nil {
			return err
		}
		pf := plotFile{name: strings.TrimSuffix(filepath.Base(path), ".json"), f: f}
		if only != "" {
			pf.series = strings.Split(only, ",")
		}
		files = append(files, pf)
	}
	p, err := plotBench(files, *metric, *mode, *op, *title)
	if err != nil {
		return err
	}
	if err := p.Save(vg.Length(*width)*vg.Inch, vg.Length(*height)*vg.Inch, *out); err != nil {
		return fmt.Errorf("bench plot: writing %s: %w", filepath.Base(*out), err)
	}
	return nil
}

// plotLine is one line of the plot.
type plotLine struct {
	label string
	pts   plotter.XYs
}

// plotFile is one --json file and the series to draw from it (all when
// series is empty).
type plotFile struct {
	name   string
	f      *benchFile
	series []string
}

// plotLines picks, per report and series, the points to draw: sizes
// against the metric of the mode, dropping points a log axis cannot show
// (zero bandwidth).
func plotLines(files []plotFile, metric, mode, op string) ([]plotLine, []string) {
	var lines []plotLine
	var what, fileOf []string
	for _, pf := range files {
		for _, r := range pf.f.Reports {
			if op != "" && r.Op != op {
				continue
			}
			what = append(what, fmt.Sprintf("%s n=%d", r.Op, r.NProc))
			m := mode
			if m == "auto" {
				m = "in-place"
				if len(r.Series) > 0 && hasMode(r.Series[0].Rows, false) {
					m = "out-of-place"
				}
			}
			for _, s := range r.Series {
				if len(pf.series) > 0 && !slices.Contains(pf.series, s.Name) {
					continue
				}
				sm := m
				if !hasMode(s.Rows, sm == "in-place") {
					sm = map[string]string{"in-place": "out-of-place", "out-of-place": "in-place"}[sm]
				}
				var pts plotter.XYs
				for _, row := range s.Rows {
					res := row.OOP
					if sm == "in-place" {
						res = row.IP
					}
					if res == nil {
						continue
					}
					y := res.BusBW
					if metric == "algbw" {
						y = res.AlgBW
					}
					if y > 0 && row.Bytes > 0 {
						pts = append(pts, plotter.XY{X: float64(row.Bytes), Y: y})
					}
				}
				if len(pts) > 0 {
					lines = append(lines, plotLine{label: fmt.Sprintf("%s %s n=%d (%s)", s.Name, r.Op, r.NProc, sm), pts: pts})
					fileOf = append(fileOf, pf.name)
				}
			}
		}
	}
	seen := map[string]int{}
	for _, l := range lines {
		seen[l.label]++
	}
	for i := range lines {
		if seen[lines[i].label] > 1 {
			lines[i].label = fileOf[i] + ": " + lines[i].label
		}
	}
	return lines, what
}

func hasMode(rows []benchRow, inPlace bool) bool {
	for _, row := range rows {
		if (inPlace && row.IP != nil) || (!inPlace && row.OOP != nil) {
			return true
		}
	}
	return false
}

// plotBench builds the plot of the files' reports.
func plotBench(files []plotFile, metric, mode, op, title string) (*plot.Plot, error) {
	lines, what := plotLines(files, metric, mode, op)
	if len(lines) == 0 {
		return nil, fmt.Errorf("bench plot: no point above zero %s to draw (at one rank busbw is 0 for most ops: try --metric algbw)", metric)
	}
	p := plot.New()
	if title == "" {
		title = strings.Join(uniq(what), ", ")
	}
	p.Title.Text = title
	p.X.Label.Text = "size (bytes)"
	p.Y.Label.Text = metric + " (GB/s)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	// Bottom right: bandwidth grows with size, so the lines leave that corner empty.
	p.Legend.Top, p.Legend.Left = false, false
	for i, l := range lines {
		ln, pt, err := plotter.NewLinePoints(l.pts)
		if err != nil {
			return nil, fmt.Errorf("bench plot: %s: %w", l.label, err)
		}
		ln.Color = plotutil.Color(i)
		ln.Dashes = plotutil.Dashes(i / 7)
		pt.Color = plotutil.Color(i)
		pt.Shape = plotutil.Shape(i)
		p.Add(ln, pt)
		p.Legend.Add(l.label, ln, pt)
	}
	// A log axis needs a positive range: widen a single value's.
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		if ax.Min >= ax.Max {
			ax.Min, ax.Max = ax.Min/2, ax.Max*2
		}
	}
	return p, nil
}

func uniq(xs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
