package main

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
)

// benchC holds the C peers of conftest bench, compiled at run time where
// their compilers are (gcc for the raw libucc loop, mpicc for Open MPI):
// the directory has no Go files, so go build leaves them alone.
//
//go:embed benchc/ucc-bench-raw.c benchc/bench-mpi.c
var benchC embed.FS

// benchSeries is one column group of the table: a name and how to run it
// at n ranks ("BENCH bytes microseconds" lines, bytes to the max over
// ranks of the mean time).
type benchSeries struct {
	name   string
	launch func(n int) (map[int]float64, error)
}

// rawName is the raw libucc loop's series.
const rawName = "raw-ucc"

// peerFlags are conftest bench's flags for the C peers.
type peerFlags struct {
	wrap       string
	raw        bool
	rawThread  string
	uccInclude string
	cpupool    bool
	mpi        bool
	mpirun     string
	mpiBin     string // compiled by series
}

// series compiles what the C peers need into dir and returns the raw
// libucc loop's series (for --backend ucc with --raw); the MPI program is
// compiled here too, so a missing compiler fails before any run.
func (pf *peerFlags) series(dir, be, sizes, iters string, wrap []string) ([]benchSeries, error) {
	var out []benchSeries
	if be == "ucc" && pf.raw {
		if pf.rawThread != "single" && pf.rawThread != "multiple" {
			return nil, fmt.Errorf("bad --raw-thread %q (single or multiple)", pf.rawThread)
		}
		inc, err := uccInclude(pf.uccInclude)
		if err != nil {
			return nil, err
		}
		// Only ucc/ from that directory: a root's own libc headers must not
		// shadow this machine's.
		incDir := filepath.Join(dir, "include")
		if err := os.MkdirAll(incDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink(filepath.Join(inc, "ucc"), filepath.Join(incDir, "ucc")); err != nil {
			return nil, err
		}
		bin, err := buildC(dir, "ucc-bench-raw.c", "gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"+incDir, "-ldl")
		if err != nil {
			return nil, err
		}
		thread := pf.rawThread
		out = append(out, benchSeries{name: rawName, launch: func(n int) (map[int]float64, error) {
			return launchBench(n, func(port int) []string {
				shm := fmt.Sprintf("/dev/shm/gocoll-ucc-bench-raw-%d-%d", os.Getpid(), port)
				return append(append([]string{}, wrap...), bin, "--sizes", sizes, "--iters", iters, "--thread", thread, "--shm", shm)
			}, true)
		}})
	}
	if pf.mpi {
		bin, err := buildC(dir, "bench-mpi.c", "mpicc", "-O2", "-Wall", "-Wextra", "-Werror")
		if err != nil {
			return nil, err
		}
		pf.mpiBin = bin
	}
	return out, nil
}

// mpiSeries runs the compiled MPI program under mpirun, one launcher
// process for all ranks.
func (pf *peerFlags) mpiSeries(sizes, iters string) benchSeries {
	return benchSeries{name: "openmpi", launch: func(n int) (map[int]float64, error) {
		return launchBench(1, func(int) []string {
			return append(strings.Fields(pf.mpirun), "-np", strconv.Itoa(n), pf.mpiBin, "--sizes", sizes, "--iters", iters)
		}, false)
	}}
}

// uccInclude finds the directory holding ucc/api/ucc.h: the flag, else
// GOCOLL_UCC_INCLUDE (scripts/ucc-gpu-env.sh), else the sid root's
// (scripts/ucc-common.sh's rule for where the root lives).
func uccInclude(flagDir string) (string, error) {
	dir := flagDir
	if dir == "" {
		dir = os.Getenv("GOCOLL_UCC_INCLUDE")
	}
	if dir == "" {
		root := os.Getenv("GOCOLL_UCC_ROOT")
		if root == "" {
			cache := os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				cache = filepath.Join(os.Getenv("HOME"), ".cache")
			}
			root = filepath.Join(cache, "gocoll", "ucc-sid")
		}
		dir = filepath.Join(root, "usr", "include")
	}
	if _, err := os.Stat(filepath.Join(dir, "ucc", "api", "ucc.h")); err != nil {
		return "", fmt.Errorf("the raw libucc loop needs ucc/api/ucc.h (build the sid root with scripts/ucc-root.sh, or pass --ucc-include, or --raw=false): %w", err)
	}
	return dir, nil
}

// buildC writes the embedded benchc/name into dir and compiles it with cc
// (flags after the source, so that -l flags follow it).
func buildC(dir, name, cc string, flags ...string) (string, error) {
	src, err := benchC.ReadFile("benchc/" + name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, src, 0o644); err != nil {
		return "", err
	}
	bin := strings.TrimSuffix(path, ".c")
	out, err := exec.Command(cc, append([]string{"-o", bin, path}, flags...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("compiling %s with %s: %w: %s", name, cc, err, out)
	}
	return bin, nil
}

// fastest keeps, per size, the smaller of the two times.
func fastest(have, got map[int]float64) map[int]float64 {
	if have == nil {
		return got
	}
	for b, us := range got {
		if old, ok := have[b]; !ok || us < old {
			have[b] = us
		}
	}
	return have
}

// printBench prints one world size's table: the measured backend's time
// and bandwidths, then each peer's time and the ratio peer / ours (above 1:
// ours is faster). Beside the raw libucc loop it prints the backend's cost
// over it, in µs and in percent, and after the table the goals of issue 12
// (≤ 1 µs at 8 B, ≤ 5 % at 1 MiB and above) as met or missed.
func printBench(n int, sizes []string, series []benchSeries, res []map[int]float64, repeat int) {
	fmt.Printf("\nallreduce float32 sum, %d ranks, %s (time: max over ranks, mean over iterations", n, series[0].name)
	if repeat > 1 {
		fmt.Printf("; fastest of %d interleaved runs", repeat)
	}
	fmt.Println(")")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "bytes\tcount\ttime(us)\talgbw(GB/s)\tbusbw(GB/s)\t"
	for _, s := range series[1:] {
		head += s.name + "(us)\t" + s.name + "/ours\t"
		if s.name == rawName {
			head += "cost(us)\tcost(%)\t"
		}
	}
	fmt.Fprintln(tw, head)
	bus := 2 * float64(n-1) / float64(n)
	var goals []string
	for _, s := range sizes {
		b, _ := strconv.Atoi(s)
		us := res[0][b]
		alg := float64(b) / us / 1e3
		row := fmt.Sprintf("%d\t%d\t%.2f\t%.3f\t%.3f\t", b, b/4, us, alg, alg*bus)
		for i, s := range series[1:] {
			p, ok := res[i+1][b]
			if !ok {
				row += "-\t-\t"
				if s.name == rawName {
					row += "-\t-\t"
				}
				continue
			}
			row += fmt.Sprintf("%.2f\t%.2fx\t", p, p/us)
			if s.name == rawName {
				cost, pct := us-p, 100*(us-p)/p
				row += fmt.Sprintf("%+.2f\t%+.1f%%\t", cost, pct)
				switch {
				case b <= 8:
					goals = append(goals, fmt.Sprintf("%d B: +%.2f µs over raw libucc (goal <= 1 µs): %s", b, cost, metOrMissed(cost <= 1)))
				case b >= 1<<20:
					goals = append(goals, fmt.Sprintf("%d B: %+.1f%% over raw libucc (goal <= 5%%): %s", b, pct, metOrMissed(pct <= 5)))
				}
			}
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	for _, g := range goals {
		fmt.Println("goal:", g)
	}
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
