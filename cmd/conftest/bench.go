package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/python"
	"github.com/gocoll/gocoll/tensor"
)

const benchPrefix = "BENCH "

// bench runs the allreduce benchmark (float32 SUM, out of the dispatcher's
// public path) of --backend over each world size, and beside it the peers
// asked for, each in the same invocation so that the ratios compare runs
// made back to back: for ucc the raw libucc loop (benchc/ucc-bench-raw.c),
// cpupool, torch's gloo through python/bench_gloo.py and Open MPI through
// benchc/bench-mpi.c (all embedded in this binary, so it runs from any
// directory; the C programs are compiled at run time with gcc and mpicc).
// Times are in nccl-tests' units: algbw = bytes / time, busbw = algbw *
// 2(n-1)/n. With --repeat R every series runs R times, interleaved, and the
// table keeps each size's fastest run.
func bench(args []string) error {
	fs := flag.NewFlagSet("conftest bench", flag.ExitOnError)
	be := fs.String("backend", cpupool.Name, "the backend measured: cpupool or ucc")
	nprocs := fs.String("nproc", "2,4", "world sizes, comma-separated")
	minB := fs.String("min", "8", "smallest message in bytes (K, M suffixes)")
	maxB := fs.String("max", "64M", "largest message in bytes")
	factor := fs.Int("factor", 8, "size step factor")
	threads := fs.Int("threads", 2, "cpupool worker threads")
	gloo := fs.Bool("gloo", false, "also run torch gloo (python/bench_gloo.py, embedded) on the same sizes")
	py := fs.String("python", "/usr/bin/python3", "python with torch, for --gloo")
	script := fs.String("script", "", "the gloo benchmark script (default: the embedded python/bench_gloo.py)")
	scale := fs.Float64("iters", 1, "scale the iteration counts")
	sizeList := fs.String("sizes", "8,64,512,4K,32K,64K,256K,1M,4M,16M,64M", "message sizes (overrides --min/--max/--factor when set)")
	tune := fs.String("tune", "", "extra bench-rank flags, e.g. cpupool's '--segment 1048576 --sockbuf 4194304', or '--cpuprofile FILE'")
	var pf peerFlags
	fs.StringVar(&pf.wrap, "wrap", "", "command prefix for the ranks of ucc and of the raw loop, e.g. 'scripts/ucc-run.sh --' (the sid root)")
	fs.BoolVar(&pf.raw, "raw", true, "with --backend ucc: also the raw libucc loop (benchc/ucc-bench-raw.c, compiled with gcc)")
	fs.StringVar(&pf.rawThread, "raw-thread", "multiple", "the raw loop's UCC thread mode: multiple (the backend's) or single")
	fs.StringVar(&pf.uccInclude, "ucc-include", "", "directory holding ucc/api/ucc.h for the raw loop (default: GOCOLL_UCC_INCLUDE, else the sid root's usr/include)")
	fs.BoolVar(&pf.cpupool, "cpupool", false, "with another --backend: also cpupool")
	fs.BoolVar(&pf.mpi, "mpi", false, "also Open MPI (benchc/bench-mpi.c, compiled with mpicc, run with mpirun)")
	fs.StringVar(&pf.mpirun, "mpirun", "mpirun --allow-run-as-root --oversubscribe", "the mpirun command line, for --mpi (-np N and the program are appended)")
	repeat := fs.Int("repeat", 1, "run every series this many times, interleaved; each size keeps its fastest run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *be != cpupool.Name && *be != "ucc" {
		return fmt.Errorf("bad --backend %q (cpupool or ucc)", *be)
	}
	printMachine(os.Stdout, 0) // gpus.go: the machine section (NVML), or the line saying why there is none
	lo, err := parseBytes(*minB)
	if err != nil {
		return err
	}
	hi, err := parseBytes(*maxB)
	if err != nil {
		return err
	}
	var sizes []string
	for s := lo; s <= hi; s *= *factor {
		sizes = append(sizes, strconv.Itoa(s))
	}
	if last, _ := strconv.Atoi(sizes[len(sizes)-1]); last != hi {
		sizes = append(sizes, strconv.Itoa(hi))
	}
	if *sizeList != "" {
		sizes = sizes[:0]
		for _, x := range strings.Split(*sizeList, ",") {
			b, err := parseBytes(strings.TrimSpace(x))
			if err != nil {
				return err
			}
			sizes = append(sizes, strconv.Itoa(b))
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
	glooScript := *script
	if *gloo && glooScript == "" {
		if glooScript, err = python.Write(dir, "bench_gloo.py"); err != nil {
			return err
		}
	}
	sz := strings.Join(sizes, ",")
	iters := fmt.Sprint(*scale)
	wrap := strings.Fields(pf.wrap)
	rankCmd := func(name string, tuned bool) func(int) []string {
		return func(int) []string {
			argv := append([]string{}, wrap...)
			if name == cpupool.Name {
				argv = nil // cpupool runs on this machine
			}
			argv = append(argv, exe, "bench-rank", "--backend", name, "--sizes", sz, "--threads", strconv.Itoa(*threads), "--iters", iters)
			if tuned {
				argv = append(argv, strings.Fields(*tune)...)
			}
			return argv
		}
	}
	series := []benchSeries{{name: *be, launch: func(n int) (map[int]float64, error) { return launchBench(n, rankCmd(*be, true), true) }}}
	peers, err := pf.series(dir, *be, sz, iters, wrap)
	if err != nil {
		return err
	}
	series = append(series, peers...)
	if *be != cpupool.Name && pf.cpupool {
		series = append(series, benchSeries{name: cpupool.Name, launch: func(n int) (map[int]float64, error) {
			return launchBench(n, rankCmd(cpupool.Name, false), true)
		}})
	}
	if *gloo {
		series = append(series, benchSeries{name: "gloo", launch: func(n int) (map[int]float64, error) {
			return launchBench(1, func(port int) []string {
				return []string{*py, glooScript, "--nproc", strconv.Itoa(n), "--port", strconv.Itoa(port), "--sizes", sz, "--iters", iters}
			}, false)
		}})
	}
	if pf.mpi {
		series = append(series, pf.mpiSeries(sz, iters))
	}
	for _, ns := range strings.Split(*nprocs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --nproc %q", ns)
		}
		res := make([]map[int]float64, len(series))
		for range max(1, *repeat) {
			for i, s := range series {
				got, err := s.launch(n)
				if err != nil {
					return fmt.Errorf("%s bench, %d ranks: %w", s.name, n, err)
				}
				res[i] = fastest(res[i], got)
			}
		}
		printBench(n, sizes, series, res, *repeat)
	}
	return nil
}

func parseBytes(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	v, err := strconv.Atoi(s)
	if err != nil || v*mult < 4 {
		return 0, fmt.Errorf("bad size %q (at least 4 bytes)", s)
	}
	return v * mult, nil
}

// launchBench starts n processes (torchrun's variables when env) and
// collects the "BENCH bytes microseconds" lines of any of them.
func launchBench(n int, command func(port int) []string, env bool) (map[int]float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	res := map[int]float64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		argv := command(port)
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
			for sc.Scan() {
				f := strings.Fields(strings.TrimPrefix(sc.Text(), benchPrefix))
				if !strings.HasPrefix(sc.Text(), benchPrefix) || len(f) != 2 {
					continue
				}
				b, _ := strconv.Atoi(f[0])
				us, _ := strconv.ParseFloat(f[1], 64)
				mu.Lock()
				res[b] = us
				mu.Unlock()
			}
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("process %d: %w: %s", r, err, stderr.String())
				time.AfterFunc(3*time.Second, cancel) // let the others report first
			}
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

// benchRank is one rank of the gocoll benchmark.
func benchRank(args []string) error {
	fs := flag.NewFlagSet("conftest bench-rank", flag.ExitOnError)
	be := fs.String("backend", cpupool.Name, "the backend: cpupool or ucc")
	cpuprofile := fs.String("cpuprofile", "", "rank 0 writes a pprof CPU profile of the timed loops here")
	sizes := fs.String("sizes", "8", "message sizes in bytes")
	threads := fs.Int("threads", 2, "cpupool worker threads")
	scale := fs.Float64("iters", 1, "scale the iteration counts")
	var o cpupool.Options
	fs.IntVar(&o.SegmentBytes, "segment", 0, "cpupool SegmentBytes (0: default)")
	fs.IntVar(&o.SmallBytes, "small", 0, "cpupool SmallBytes (0: default)")
	fs.IntVar(&o.Window, "window", 0, "cpupool Window (0: default)")
	fs.IntVar(&o.SocketBufferBytes, "sockbuf", 0, "cpupool SocketBufferBytes (0: kernel autotuning)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Threads = *threads
	ctx := context.Background()
	pg, err := dispatcher.InitFromEnv(ctx, dispatcher.Config{Backend: *be, Timeout: 5 * time.Minute,
		BackendOptions: map[string]any{cpupool.Name: &o}})
	if err != nil {
		return err
	}
	defer pg.Close(ctx)
	if *cpuprofile != "" && pg.Rank() == 0 {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, s := range strings.Split(*sizes, ",") {
		b, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		t := tensor.New(tensor.Float32, b/4)
		t.Fill(1)
		iters := int(*scale * float64(min(2000, max(5, (256<<20)/b))))
		iters = max(iters, 3)
		warm := max(2, iters/10)
		for range warm {
			w, err := pg.Allreduce(ctx, []*tensor.Tensor{t}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		// Timed loop, after the warm-up above.
		if err := barrier(ctx, pg); err != nil {
			return err
		}
		start := time.Now()
		for range iters {
			w, err := pg.Allreduce(ctx, []*tensor.Tensor{t}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		us := float64(time.Since(start).Microseconds()) / float64(iters)
		m := tensor.New(tensor.Float64, 1)
		m.SetAt(0, us)
		w, err := pg.Allreduce(ctx, []*tensor.Tensor{m}, backend.AllreduceOptions{ReduceOp: backend.MAX})
		if err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if pg.Rank() == 0 {
			fmt.Printf("%s%d %.2f\n", benchPrefix, b, m.At(0))
		}
	}
	return nil
}

func barrier(ctx context.Context, pg *dispatcher.ProcessGroup) error {
	w, err := pg.Barrier(ctx, backend.BarrierOptions{})
	if err != nil {
		return err
	}
	return w.Wait(ctx)
}
