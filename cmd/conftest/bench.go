package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/python"
)

// benchPrefix starts the older one-series result lines, "BENCH bytes
// microseconds" (in-place allreduce, rank 0's max over ranks), which the
// raw libucc loop prints; the other programs print BENCH2 lines.
const benchPrefix = "BENCH "

// The peers' series names.
const (
	glooName    = "gloo"
	mpiName     = "openmpi"
	torchName   = "torch"
	allPeers    = "raw-ucc, raw-nccl, cpupool, gloo, openmpi, torch"
	benchUsageS = `usage:
  conftest bench [flags]                 nccl-tests' tables for --backend, beside its peers
  conftest bench plot -o out.svg FILE... busbw against size (log-log) from --json files
`
)

// bench is `conftest bench`: nccl-tests' measurement (see benchRank) of
// --backend for each --op, size and world size, printed as nccl-tests'
// table with each peer's time and the ratio beside ours. The peers run in
// the same invocation, one after the other (with --repeat R, R times
// interleaved, each size keeping its fastest run; with --by-size one size
// at a time, every series taking turns at it, with the turns' ratios:
// bench_turns.go): on the CPU torch's gloo
// (python/bench_torch.py) and Open MPI (benchc/bench-mpi.c, compiled with
// mpicc at run time), for ucc also the raw libucc loop
// (benchc/ucc-bench-raw.c) and cpupool; on the GPU raw NCCL on the
// backend's own communicator (in our rank processes) and torch's NCCL
// (bench_torch.py under the GPU machine's torch 2.11). Everything is
// embedded in this binary, so it runs from any directory.
func bench(args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "plot":
			return benchPlot(args[1:])
		// "overlap" (issue 16 items 3-4) goes here.
		default:
			return fmt.Errorf("unknown bench subcommand %q\n%s", args[0], benchUsageS)
		}
	}
	fs := flag.NewFlagSet("conftest bench", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsageS+"\nflags:\n")
		fs.PrintDefaults()
	}
	be := fs.String("backend", cpupool.Name, "the backend measured: cpupool, ucc or nccl (one GPU per rank)")
	opList := fs.String("op", opAllreduce, "ops, comma-separated, or all: "+strings.Join(benchOps, ", "))
	nprocs := fs.String("nproc", "2", "world sizes, comma-separated")
	var minB, maxB string
	fs.StringVar(&minB, "b", "8", "smallest size in bytes (K, M, G suffixes)")
	fs.StringVar(&minB, "min", "8", "the same as -b")
	fs.StringVar(&maxB, "e", "64M", "largest size in bytes")
	fs.StringVar(&maxB, "max", "64M", "the same as -e")
	var factor int
	fs.IntVar(&factor, "f", 2, "size step factor")
	fs.IntVar(&factor, "factor", 2, "the same as -f")
	sizeList := fs.String("sizes", "", "message sizes, comma-separated (instead of -b/-e/-f)")
	iters := fs.Int("n", 20, "timed iterations per size (0: the older adaptive count, min(2000, 256 MiB/size) scaled by --iters; the default with the raw-ucc peer, which has only that count)")
	warmup := fs.Int("w", 5, "warm-up iterations per size")
	check := fs.Int("c", 0, "1: check every result; a wrong element counts in #wrong and fails the command")
	jsonOut := fs.String("json", "", "write the rows of every table to this file (`conftest bench plot` reads it)")
	note := fs.String("note", "", "a note for the --json file (e.g. the machine's load)")
	peerList := fs.String("peers", "auto", "peers, comma-separated, or none; auto: gloo,openmpi for cpupool; raw-ucc,gloo,openmpi for ucc; raw-nccl,torch for nccl. All: "+allPeers)
	threads := fs.Int("threads", 2, "cpupool worker threads")
	gloo := fs.Bool("gloo", false, "add the gloo peer")
	py := fs.String("python", "", "python with torch for the gloo and torch peers (default /usr/bin/python3; for nccl, python3 from PATH)")
	script := fs.String("script", "", "the torch benchmark script (default: the embedded python/bench_torch.py)")
	scale := fs.Float64("iters", 1, "with -n 0, and for the raw libucc loop: scale the adaptive iteration counts")
	tune := fs.String("tune", "", "extra bench-rank flags, e.g. cpupool's '--segment 1048576 --sockbuf 4194304', or '--cpuprofile FILE'")
	var pf peerFlags
	fs.IntVar(&pf.depth, "depth", 0, "host backends: ops in flight, for ours and every Go peer (bench-rank's --depth) and the raw libucc loop (its --window); 1: a blocking loop, through the dispatcher's blocking forms (AllreduceWait, ...); 0: bench-rank's default")
	fs.StringVar(&pf.wrap, "wrap", "", "command prefix for the ranks of ucc and of the raw loop, e.g. 'scripts/ucc-run.sh --' (the sid root)")
	fs.BoolVar(&pf.raw, "raw", true, "with --backend ucc and auto peers: also the raw libucc loop (benchc/ucc-bench-raw.c, compiled with gcc)")
	fs.StringVar(&pf.rawThread, "raw-thread", "multiple", "the raw loop's UCC thread mode: multiple (the backend's) or single")
	fs.StringVar(&pf.uccInclude, "ucc-include", "", "directory holding ucc/api/ucc.h for the raw loop (default: GOCOLL_UCC_INCLUDE, else the sid root's usr/include)")
	fs.BoolVar(&pf.cpupool, "cpupool", false, "add the cpupool peer")
	fs.BoolVar(&pf.mpi, "mpi", false, "add the Open MPI peer")
	fs.StringVar(&pf.mpirun, "mpirun", "mpirun --allow-run-as-root --oversubscribe", "the mpirun command line (-np N and the program are appended)")
	fs.StringVar(&pf.rawBin, "raw-bin", "", "a ucc-bench-raw built beforehand, for a machine without gcc or the ucc headers (the GPU machine)")
	fs.StringVar(&pf.mpiPrebuilt, "mpi-bin", "", "a bench-mpi built beforehand with mpicc, for a machine without mpicc")
	repeat := fs.Int("repeat", 1, "run every series this many times, interleaved; each size keeps its fastest run (with --by-size: the turns per size)")
	bySize := fs.Bool("by-size", false, "one size at a time: for each size, ours and every peer take turns --repeat times, one launch each "+
		"(ours first in odd turns, last in even ones), and a turns table gives each turn's ratio ours / peer and their median "+
		"(the ≤ 1 µs and ≤ 5 % goal lines of the raw libucc loop then read the medians); see docs/perf.md's ucc section")
	pinList := fs.String("pin", "", "CPU lists, comma-separated (taskset --cpu-list entries: 3 or 2-5): rank r of ours, of the raw libucc loop and of cpupool runs on entry r mod their number, the same for every series. A Go rank on one CPU runs with GOMAXPROCS 1 (Go reads the affinity mask) and its progress goroutine shares that CPU: on nvidia-h200 one CPU per rank made ucc 1.1-1.9x the raw loop at 1-16 MiB where unpinned it was within 0.93-1.24x, so give each rank 2 or more")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("conftest bench: unexpected arguments %q", fs.Args())
	}
	if *be != cpupool.Name && *be != "ucc" && *be != nccl.Name {
		return fmt.Errorf("bad --backend %q (cpupool, ucc or nccl)", *be)
	}
	if *check != 0 && *check != 1 {
		return fmt.Errorf("bad -c %d (0 or 1)", *check)
	}
	if *iters < 0 || *warmup < 0 {
		return fmt.Errorf("bad -n %d / -w %d (at least 0)", *iters, *warmup)
	}
	ops, err := parseOps(*opList)
	if err != nil {
		return err
	}
	sizes, err := benchSizes(minB, maxB, factor, *sizeList)
	if err != nil {
		return err
	}
	var ns []int
	for _, s := range strings.Split(*nprocs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --nproc %q (a positive world size, or a comma-separated list)", s)
		}
		ns = append(ns, n)
	}
	peers, err := resolvePeers(*be, *peerList, &pf, *gloo)
	if err != nil {
		return err
	}
	pin, err := parsePin(*pinList)
	if err != nil {
		return err
	}
	if *bySize && *repeat < 2 {
		return fmt.Errorf("--by-size needs --repeat 2 or more (the turns per size; 5 or more for a median worth reading)")
	}
	setN := false
	fs.Visit(func(f *flag.Flag) { setN = setN || f.Name == "n" })
	if slices.Contains(peers, rawName) && !setN {
		// The raw libucc loop has only the adaptive count: give every
		// series the same numbers of iterations.
		*iters = 0
	}
	if *py == "" {
		*py = "/usr/bin/python3"
		if *be == nccl.Name {
			*py = "python3"
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Under /tmp (TMPDIR), which scripts/ucc-run.sh shows inside the root.
	dir, err := os.MkdirTemp("", "conftest-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sz := joinInts(sizes)
	opsArg := strings.Join(ops, ",")
	// common is the flags every rank program takes, for the sizes of one
	// launch (all of them, or one with --by-size).
	common := func(sz string) []string {
		c := []string{"--op", opsArg, "--sizes", sz, "-n", strconv.Itoa(*iters), "-w", strconv.Itoa(*warmup), "--iters", fmt.Sprint(*scale)}
		if pf.depth > 0 {
			c = append(c, "--depth", strconv.Itoa(pf.depth))
		}
		if *check == 1 {
			c = append(c, "-c")
		}
		return c
	}
	wrap := strings.Fields(pf.wrap)
	rankCmd := func(name string, ours bool, sz string) func(int) []string {
		return func(int) []string {
			var argv []string
			if name == "ucc" {
				argv = append(argv, wrap...) // cpupool and nccl run on this machine
			}
			argv = append(argv, exe, "bench-rank", "--backend", name, "--threads", strconv.Itoa(*threads))
			argv = append(argv, common(sz)...)
			if ours {
				if slices.Contains(peers, rawNCCLName) {
					argv = append(argv, "--raw-nccl")
				}
				argv = append(argv, strings.Fields(*tune)...)
			}
			return argv
		}
	}
	oursSeries := benchSeries{name: *be, launch: func(n int, sz string, pr *progress) ([]benchSample, error) {
		return launchBench(n, rankCmd(*be, true, sz), true, *be, pin, pr)
	}}
	if slices.Contains(peers, rawNCCLName) {
		oursSeries.also = []string{rawNCCLName}
	}
	series := []benchSeries{oursSeries}
	for _, p := range peers {
		switch p {
		case rawName:
			if !slices.Contains(ops, opAllreduce) {
				continue // the raw libucc loop runs allreduce only
			}
			pf.raw = true
			mpi := pf.mpi
			pf.mpi = false // compiled below, with its own series
			raw, err := pf.series(dir, "ucc", fmt.Sprint(*scale), wrap, pin)
			pf.mpi = mpi
			if err != nil {
				return err
			}
			for i := range raw {
				raw[i].ops = []string{opAllreduce}
			}
			series = append(series, raw...)
		case cpupool.Name:
			series = append(series, benchSeries{name: cpupool.Name, launch: func(n int, sz string, pr *progress) ([]benchSample, error) {
				return launchBench(n, rankCmd(cpupool.Name, false, sz), true, cpupool.Name, pin, pr)
			}})
		case glooName, torchName:
			torchScript := *script
			if torchScript == "" {
				if torchScript, err = python.Write(dir, "bench_torch.py"); err != nil {
					return err
				}
			}
			tbe := "gloo"
			if p == torchName {
				tbe = "nccl"
			}
			name, pyBin := p, *py
			series = append(series, benchSeries{name: name, launch: func(n int, sz string, pr *progress) ([]benchSample, error) {
				return launchBench(1, func(port int) []string {
					return append([]string{pyBin, torchScript, "--backend", tbe, "--series", name, "--nproc", strconv.Itoa(n), "--port", strconv.Itoa(port)}, common(sz)...)
				}, false, name, nil, pr)
			}})
		case mpiName:
			pf.mpi = true
			if _, err := pf.series(dir, "", "", nil, nil); err != nil {
				return err
			}
			series = append(series, pf.mpiSeries(common))
		}
	}
	// gpus.go: the machine section (NVML), or the line saying why there is
	// none; the --json reports carry its lines too.
	var machine bytes.Buffer
	printMachine(io.MultiWriter(os.Stdout, &machine), 0)
	machineJSON, err := json.Marshal(strings.Split(strings.TrimRight(machine.String(), "\n"), "\n"))
	if err != nil {
		return err
	}
	file := &benchFile{Date: time.Now().UTC().Format(time.RFC3339), Command: os.Args, Note: *note}
	file.Host, _ = os.Hostname()
	var wrong int64
	var peerErrs []error
	for _, n := range ns {
		pr := newProgress(series, ops, sizes, n, *repeat)
		res := map[sampleKey]benchRow{}
		var turns []benchTurn
		// one launches series i (s) at the sizes sz, folds its rows into
		// res and returns them; the error is ours failing (the whole
		// command fails), a peer's is kept in peerErrs.
		one := func(i int, s benchSeries, sz string) (map[sampleKey]benchRow, error) {
			samples, err := s.launch(n, sz, pr)
			if err != nil {
				err = fmt.Errorf("%s bench, %d ranks: %w", s.name, n, err)
				if i == 0 {
					return nil, err
				}
				// A failing peer costs its columns, not the tables.
				fmt.Fprintf(os.Stderr, "conftest bench: %v\n", err)
				peerErrs = append(peerErrs, err)
			}
			rows := aggregate(samples, n)
			for k, row := range rows {
				if have, ok := res[k]; ok {
					row = faster(have, row)
				}
				res[k] = row
			}
			return rows, nil
		}
		if *bySize {
			for _, b := range sizes {
				for t := range *repeat {
					for _, i := range turnOrder(len(series), t) {
						rows, err := one(i, series[i], strconv.Itoa(b))
						if err != nil {
							pr.done()
							return err
						}
						turns = append(turns, turnsOf(rows, series[i], t+1)...)
					}
				}
			}
		} else {
			for range max(1, *repeat) {
				for i, s := range series {
					if _, err := one(i, s, sz); err != nil {
						pr.done()
						return err
					}
				}
			}
		}
		pr.done()
		for _, op := range ops {
			rep := benchReport{Op: op, Backend: *be, NProc: n, Iters: *iters, Warmup: *warmup, Check: *check == 1, Repeat: max(1, *repeat), BySize: *bySize, Machine: machineJSON}
			for _, t := range turns {
				if t.Op == op {
					rep.Turns = append(rep.Turns, t)
				}
			}
			for _, s := range series {
				for _, name := range append([]string{s.name}, s.also...) {
					var rows []benchRow
					for _, b := range sizes {
						if row, ok := res[sampleKey{name, op, int64(opCount(op, b, n) * 4)}]; ok && opCount(op, b, n) > 0 {
							rows = append(rows, row)
						}
					}
					if len(rows) > 0 || name == *be {
						rep.Series = append(rep.Series, benchSeriesResult{Name: name, Rows: rows})
					}
				}
			}
			writeTable(os.Stdout, &rep)
			writeTurns(os.Stdout, &rep)
			wrong += rep.wrongTotal()
			file.Reports = append(file.Reports, rep)
		}
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, file); err != nil {
			return err
		}
	}
	if wrong > 0 {
		peerErrs = append(peerErrs, fmt.Errorf("%d wrong elements (see the #wrong columns)", wrong))
	}
	return errors.Join(peerErrs...)
}

// resolvePeers turns --peers (and the older --gloo, --mpi, --cpupool and
// --raw switches) into the peer list.
func resolvePeers(be, list string, pf *peerFlags, gloo bool) ([]string, error) {
	var peers []string
	switch list {
	case "auto":
		switch be {
		case cpupool.Name:
			peers = []string{glooName, mpiName}
		case "ucc":
			peers = []string{glooName, mpiName}
			if pf.raw {
				peers = append([]string{rawName}, peers...)
			}
		case nccl.Name:
			peers = []string{rawNCCLName, torchName}
		}
	case "none", "":
	default:
		for _, p := range strings.Split(list, ",") {
			peers = append(peers, strings.TrimSpace(p))
		}
	}
	if gloo {
		peers = append(peers, glooName)
	}
	if pf.mpi {
		peers = append(peers, mpiName)
	}
	if pf.cpupool {
		peers = append(peers, cpupool.Name)
	}
	var out []string
	for _, p := range peers {
		if slices.Contains(out, p) {
			continue
		}
		switch {
		case !strings.Contains(", "+allPeers+",", ", "+p+","):
			return nil, fmt.Errorf("bad --peers entry %q (%s, auto or none)", p, allPeers)
		case p == be:
			return nil, fmt.Errorf("--peers %q: that is the backend measured", p)
		case (p == rawNCCLName || p == torchName) != (be == nccl.Name):
			return nil, fmt.Errorf("--peers %q does not go with --backend %s (raw-nccl and torch are the GPU peers, the others the CPU ones)", p, be)
		case p == rawName && be != "ucc":
			return nil, fmt.Errorf("--peers raw-ucc needs --backend ucc")
		}
		out = append(out, p)
	}
	return out, nil
}

// benchSizes is -b, -e and -f (nccl-tests' flags), or --sizes.
func benchSizes(minB, maxB string, factor int, list string) ([]int, error) {
	var sizes []int
	if list != "" {
		for _, x := range strings.Split(list, ",") {
			b, err := parseBytes(strings.TrimSpace(x))
			if err != nil {
				return nil, err
			}
			sizes = append(sizes, b)
		}
		return sizes, nil
	}
	lo, err := parseBytes(minB)
	if err != nil {
		return nil, err
	}
	hi, err := parseBytes(maxB)
	if err != nil {
		return nil, err
	}
	if factor < 2 {
		return nil, fmt.Errorf("bad -f %d (at least 2)", factor)
	}
	if lo > hi {
		return nil, fmt.Errorf("-b %s is above -e %s", minB, maxB)
	}
	for s := lo; s <= hi; s *= factor {
		sizes = append(sizes, s)
	}
	if sizes[len(sizes)-1] != hi {
		sizes = append(sizes, hi)
	}
	return sizes, nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseBytes(s string) (int, error) {
	mult, num := 1, s
	switch {
	case strings.HasSuffix(s, "K"):
		mult, num = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, num = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, num = 1<<30, strings.TrimSuffix(s, "G")
	}
	v, err := strconv.Atoi(num)
	if err != nil || v*mult < 4 {
		return 0, fmt.Errorf("bad size %q (bytes, at least 4, with an optional K, M or G)", s)
	}
	return v * mult, nil
}

// launchBench starts n processes (torchrun's variables when env) and
// collects the result lines of all of them; lines in the older format
// belong to series def.
//
// With pin (--pin), rank r runs under taskset on pin[r mod len(pin)].
func launchBench(n int, command func(port int) []string, env bool, def string, pin []string, pr *progress) ([]benchSample, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var res []benchSample
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		argv := command(port)
		if len(pin) > 0 {
			argv = append([]string{"taskset", "--cpu-list", pin[r%len(pin)]}, argv...)
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		if env {
			cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
				"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		wg.Go(func() {
			sc := bufio.NewScanner(out)
			var perr error
			for sc.Scan() {
				s, ok, err := parseBenchLine(sc.Text(), def)
				if err != nil && perr == nil {
					perr = err
				}
				if !ok {
					continue
				}
				mu.Lock()
				res = append(res, s)
				mu.Unlock()
				if s.rank == 0 {
					pr.step(s)
				}
			}
			err := cmd.Wait()
			if err != nil {
				errs[r] = fmt.Errorf("process %d: %w: %s", r, err, stderr.String())
				time.AfterFunc(3*time.Second, cancel) // let the others report first
			} else if perr != nil {
				errs[r] = fmt.Errorf("process %d: %w", r, perr)
			}
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}
