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
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/python"
	"github.com/gocoll/gocoll/tensor"
)

const benchPrefix = "BENCH "

// bench runs the allreduce benchmark (float32 SUM, out of the dispatcher's
// public path) over each world size, and with --gloo the same sizes on
// torch's gloo through python/bench_gloo.py (embedded in this binary, so it
// runs from any directory), and prints them side by side
// in nccl-tests' units: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
func bench(args []string) error {
	fs := flag.NewFlagSet("conftest bench", flag.ExitOnError)
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
	tune := fs.String("tune", "", "extra bench-rank flags for cpupool, e.g. '--segment 1048576 --sockbuf 4194304'")
	if err := fs.Parse(args); err != nil {
		return err
	}
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
	glooScript := *script
	if *gloo && glooScript == "" {
		dir, err := os.MkdirTemp("", "conftest-gloo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if glooScript, err = python.Write(dir, "bench_gloo.py"); err != nil {
			return err
		}
	}
	for _, ns := range strings.Split(*nprocs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --nproc %q", ns)
		}
		ours, err := launchBench(n, func(port int) []string {
			return append([]string{exe, "bench-rank", "--sizes", strings.Join(sizes, ","), "--threads", strconv.Itoa(*threads), "--iters", fmt.Sprint(*scale)}, strings.Fields(*tune)...)
		}, true)
		if err != nil {
			return fmt.Errorf("gocoll bench, %d ranks: %w", n, err)
		}
		var theirs map[int]float64
		if *gloo {
			theirs, err = launchBench(1, func(port int) []string {
				return []string{*py, glooScript, "--nproc", strconv.Itoa(n), "--port", strconv.Itoa(port), "--sizes", strings.Join(sizes, ","), "--iters", fmt.Sprint(*scale)}
			}, false)
			if err != nil {
				return fmt.Errorf("gloo bench, %d ranks: %w", n, err)
			}
		}
		printBench(n, sizes, ours, theirs)
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

func printBench(n int, sizes []string, ours, theirs map[int]float64) {
	fmt.Printf("\nallreduce float32 sum, %d ranks (time: max over ranks, mean over iterations)\n", n)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "bytes\tcount\ttime(us)\talgbw(GB/s)\tbusbw(GB/s)\t"
	if theirs != nil {
		head += "gloo time(us)\tgloo algbw\tgloo busbw\tspeedup\t"
	}
	fmt.Fprintln(tw, head)
	bus := 2 * float64(n-1) / float64(n)
	for _, s := range sizes {
		b, _ := strconv.Atoi(s)
		us := ours[b]
		alg := float64(b) / us / 1e3
		row := fmt.Sprintf("%d\t%d\t%.1f\t%.3f\t%.3f\t", b, b/4, us, alg, alg*bus)
		if theirs != nil {
			g := theirs[b]
			galg := float64(b) / g / 1e3
			row += fmt.Sprintf("%.1f\t%.3f\t%.3f\t%.2fx\t", g, galg, galg*bus, g/us)
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
}

// benchRank is one rank of the gocoll benchmark.
func benchRank(args []string) error {
	fs := flag.NewFlagSet("conftest bench-rank", flag.ExitOnError)
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
	pg, err := dispatcher.InitFromEnv(ctx, dispatcher.Config{Backend: cpupool.Name, Timeout: 5 * time.Minute,
		BackendOptions: map[string]any{cpupool.Name: &o}})
	if err != nil {
		return err
	}
	defer pg.Close(ctx)
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
