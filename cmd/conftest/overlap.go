package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/gpubench"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// benchMode returns the `conftest bench` mode that args name (overlap,
// hostcost), or nil for the table benchmark, bench(args).
func benchMode(args []string) func([]string) error {
	if len(args) == 0 {
		return nil
	}
	switch args[0] {
	case "overlap":
		return benchOverlap
	case "hostcost":
		return benchHostCost
	}
	return nil
}

// benchOverlap is `conftest bench overlap`: with --nproc 1 it runs the one
// rank here; otherwise it starts the ranks as torchrun does and each
// prints its own lines.
func benchOverlap(args []string) error {
	f, err := parseOverlapFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if f.child || f.nproc == 1 {
		return overlapRank(f)
	}
	return launchRanks(f.nproc, append([]string{"bench", "overlap", "--rank-child"}, args...))
}

// launchRanks runs this binary with args n times, with torchrun's
// variables (rank 0 hosts the TCPStore), their output passed through.
func launchRanks(n int, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_WORLD_SIZE="+strconv.Itoa(n), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			cancel()
			return err
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				cancel() // one rank's failure would leave the others hanging in a collective
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// overlapEnv is one rank's setup.
type overlapEnv struct {
	f     *overlapFlags
	rank  int
	world int
	pg    *dispatcher.ProcessGroup
	dev   *cuda.Device
	cur   *cuda.Stream // the current stream: the GEMM's
	ncs   *cuda.Stream // NCCL's internal stream, learnt from an async Work
	ctx   context.Context
	gemm  *gpubench.Gemm
	buf   []*tensor.Tensor // the allreduce's float32 buffer
	probe *tensor.Tensor   // item's one-element tensor
}

func overlapRank(f *overlapFlags) error {
	ctx := context.Background()
	local, err := strconv.Atoi(cmp.Or(os.Getenv("LOCAL_RANK"), "0"))
	if err != nil {
		return fmt.Errorf("LOCAL_RANK: %w", err)
	}
	dev, err := cuda.GetDevice(local)
	if err != nil {
		return err
	}
	d := tensor.CUDADevice(local)
	cfg := dispatcher.Config{Backend: nccl.Name, Device: &d, BackendOptions: map[string]any{
		nccl.Name: &nccl.Options{HighPriorityStream: f.highPriority, MinCTAs: f.minCTAs, MaxCTAs: f.maxCTAs}}}
	var pg *dispatcher.ProcessGroup
	if f.child {
		pg, err = dispatcher.InitFromEnv(ctx, cfg)
	} else {
		cfg.Store, cfg.WorldSize = store.NewHashStore(), 1
		pg, err = dispatcher.Init(ctx, cfg)
	}
	if err != nil {
		return err
	}
	defer pg.Close(ctx)
	cur, err := dev.NewStream(cuda.StreamOptions{})
	if err != nil {
		return err
	}
	defer cur.Destroy()
	e := &overlapEnv{f: f, rank: pg.Rank(), world: pg.Size(), pg: pg, dev: dev, cur: cur, ctx: cuda.WithStream(ctx, cur)}
	if e.gemm, err = gpubench.NewGemm(e.ctx, dev, f.gemm); err != nil {
		return err
	}
	defer e.gemm.Close()
	x, err := cuda.Zeros(e.ctx, local, tensor.Float32, int(f.sizeMB*(1<<20))/4) // zeros stay zeros under SUM at any world size
	if err != nil {
		return err
	}
	defer x.Free()
	e.buf = []*tensor.Tensor{x}
	if e.probe, err = cuda.Zeros(e.ctx, local, tensor.Float32, 1); err != nil {
		return err
	}
	defer e.probe.Free()
	// One async op tells the internal stream (the trace's second track).
	w, err := pg.Allreduce(e.ctx, e.buf, backend.AllreduceOptions{Async: true})
	if err != nil {
		return err
	}
	if err := w.Wait(e.ctx); err != nil {
		return err
	}
	nw, ok := w.(*nccl.Work)
	if !ok {
		return fmt.Errorf("bench overlap: the nccl backend returned a %T, not an *nccl.Work", w)
	}
	e.ncs = nw.Stream()
	if err := cur.Synchronize(); err != nil {
		return err
	}
	if e.rank == 0 {
		name, _ := dev.Name()
		v, _ := nccl.Version()
		fmt.Printf("overlap: %d rank(s), %s, NCCL %s, cuBLAS %s; allreduce %.4g MiB float32, GEMM %d^3 bf16, %d iters (median), high-priority %v, min/max CTAs %d/%d\n",
			e.world, name, nccl.VersionString(v), gpubench.LibraryPath(), f.sizeMB, f.gemm, f.iters, f.highPriority, f.minCTAs, f.maxCTAs)
		if e.world == 1 {
			fmt.Println("overlap: one rank: NCCL's allreduce is a local copy (nothing moves between GPUs), so ar_ms is tiny and the overlap figure means little; read both_ms against gemm_ms and the gemm/ar order")
		}
	}
	// Bring the GPU to its steady clocks first: on an idle H200 the first
	// GEMMs run at boost clocks, about 12% faster than under sustained
	// load, which would make gemm_ms (measured first) look better than
	// the GEMMs inside both.
	for range 200 {
		if err := e.gemm.Run(e.cur); err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
	}
	for _, k := range f.killers {
		// gemm and ar are measured again for each killer, next to its
		// both, so that all three see the same clocks.
		gemmMs, err := e.timed(func() error { return e.gemm.Run(e.cur) })
		if err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
		arMs, err := e.timed(func() error {
			_, err := e.pg.Allreduce(e.ctx, e.buf, backend.AllreduceOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("allreduce: %w", err)
		}
		bothMs, err := e.timed(func() error { return e.both(k, nil) })
		if err != nil {
			return fmt.Errorf("killer %s: %w", k, err)
		}
		ov, err := overlapRatio(gemmMs, arMs, bothMs)
		ovs := fmt.Sprintf("%5.2f", ov)
		if err != nil {
			ovs = "n/a"
		}
		order, gap, path, err := e.trace(k)
		if err != nil {
			return fmt.Errorf("killer %s: trace: %w", k, err)
		}
		line := fmt.Sprintf("[rank %d] killer=%-10s gemm=%7.3f ms  ar=%7.3f ms  both=%7.3f ms  overlap=%s  gap=%8.1f us  order=%s", e.rank, k, gemmMs, arMs, bothMs, ovs, gap, order)
		if path != "" {
			line += "  trace=" + path
		}
		fmt.Println(line)
	}
	return nil
}

// timed runs fn --warmup times, then --iters times between two timing
// events on the current stream, and returns the median in ms. Nothing
// synchronises inside the series (the benchmark must not be its own
// killer); the host waits once, at the end.
func (e *overlapEnv) timed(fn func() error) (float64, error) {
	for range e.f.warmup {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	if err := e.cur.Synchronize(); err != nil {
		return 0, err
	}
	n := e.f.iters
	evs, err := e.dev.NewEvents(2*n, true)
	if err != nil {
		return 0, err
	}
	defer func() {
		for _, ev := range evs {
			ev.Destroy()
		}
	}()
	for i := range n {
		if err := evs[2*i].Record(e.cur); err != nil {
			return 0, err
		}
		if err := fn(); err != nil {
			return 0, err
		}
		if err := evs[2*i+1].Record(e.cur); err != nil {
			return 0, err
		}
	}
	if err := evs[2*n-1].Synchronize(); err != nil {
		return 0, err
	}
	ms := make([]float64, n)
	for i := range n {
		d, err := cuda.ElapsedTime(evs[2*i], evs[2*i+1])
		if err != nil {
			return 0, err
		}
		ms[i] = float64(d.Nanoseconds()) / 1e6
	}
	return medianOf(ms), nil
}

// tracer records a traced iteration's marks: events on the streams and
// host times.
type tracer struct {
	e      *overlapEnv
	evs    []*cuda.Event
	names  []string
	host0  time.Time
	hspans []span
}

// mark records a timing event on s and returns its index.
func (t *tracer) mark(s *cuda.Stream, name string) (int, error) {
	ev, err := t.e.dev.NewEvent(true)
	if err != nil {
		return 0, err
	}
	t.evs, t.names = append(t.evs, ev), append(t.names, name)
	return len(t.evs) - 1, ev.Record(s)
}

// host runs fn and keeps its host interval as a span of the host track.
func (t *tracer) host(name string, fn func() error) error {
	t0 := time.Now()
	err := fn()
	t.hspans = append(t.hspans, span{track: 2, name: name, start: us(t0.Sub(t.host0)), dur: us(time.Since(t0))})
	return err
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// both is one iteration: the allreduce issued async (its kernel on the
// internal stream), the killer, the GEMM on the current stream, Wait. With
// a tracer it also marks the kernels' ends on both streams; the allreduce's
// start mark follows a wait of the internal stream on the current one, the
// one the backend makes itself, so that it is the kernel's start, not the
// moment the internal stream got there.
func (e *overlapEnv) both(killer string, t *tracer) error {
	hostDo := func(name string, fn func() error) error {
		if t == nil {
			return fn()
		}
		return t.host(name, fn)
	}
	var err error
	if t != nil {
		ev, err := e.dev.NewEvent(false)
		if err != nil {
			return err
		}
		defer ev.Destroy()
		if err := e.ncs.WaitStream(e.cur, ev); err != nil {
			return err
		}
		if _, err = t.mark(e.ncs, "ar start"); err != nil {
			return err
		}
	}
	var w backend.Work
	if err := hostDo("all_reduce (async)", func() error {
		w, err = e.pg.Allreduce(e.ctx, e.buf, backend.AllreduceOptions{Async: true})
		return err
	}); err != nil {
		return err
	}
	if t != nil {
		if _, err = t.mark(e.ncs, "ar end"); err != nil {
			return err
		}
	}
	if err := hostDo("killer "+killer, func() error { return e.kill(killer, w) }); err != nil {
		return err
	}
	if t != nil {
		if _, err = t.mark(e.cur, "gemm start"); err != nil {
			return err
		}
	}
	if err := hostDo("gemm", func() error { return e.gemm.Run(e.cur) }); err != nil {
		return err
	}
	if t != nil {
		if _, err = t.mark(e.cur, "gemm end"); err != nil {
			return err
		}
	}
	if err := hostDo("wait", func() error { return w.Wait(e.ctx) }); err != nil {
		return err
	}
	return nil
}

// kill runs the killer between the allreduce's issue and the GEMM's (see
// the killers table for what each stands for).
func (e *overlapEnv) kill(killer string, w backend.Work) error {
	switch killer {
	case "none":
		return nil
	case "item":
		// Into Go (pageable) memory: the driver returns once the copy,
		// and everything queued before it on the current stream, is done.
		// It reads a tensor of its own: reading the allreduce's buffer
		// before Wait would be a race.
		var v float32
		return e.cur.CopyDtoH(unsafe.Pointer(&v), e.probe.Ptr(), 4)
	case "early_wait":
		return w.Wait(e.ctx)
	case "sync":
		return e.dev.Synchronize()
	case "frag":
		var ptrs []uintptr
		defer func() {
			for _, p := range ptrs {
				gpubench.FreeSync(e.dev, p)
			}
		}()
		for i := range 48 {
			p, err := gpubench.AllocSync(e.dev, (1<<20)*(1+(i*7)%13))
			if err != nil {
				return err
			}
			ptrs = append(ptrs, p)
		}
		for i := 0; i < len(ptrs); i += 2 {
			if err := gpubench.FreeSync(e.dev, ptrs[i]); err != nil {
				return err
			}
			ptrs[i] = 0
		}
		ptrs = compact(ptrs)
		big, err := gpubench.AllocSync(e.dev, 200<<20)
		if err != nil {
			return err
		}
		ptrs = append(ptrs, big)
		return nil
	}
	return fmt.Errorf("unknown killer %q", killer)
}

func compact(ps []uintptr) []uintptr {
	out := ps[:0]
	for _, p := range ps {
		if p != 0 {
			out = append(out, p)
		}
	}
	return out
}

// trace runs traceIters traced both-iterations for killer and returns the
// first iteration's gemm/ar order, the median idle time of the current
// stream between one GEMM's end and the next one's start (µs), and the
// file's path when --trace is set.
func (e *overlapEnv) trace(killer string) (string, float64, string, error) {
	if err := e.dev.Synchronize(); err != nil {
		return "", 0, "", err
	}
	t := &tracer{e: e}
	defer func() {
		for _, ev := range t.evs {
			ev.Destroy()
		}
	}()
	// The origin: an event on the idle current stream, and the host clock
	// at the moment it is seen done. Host spans are placed against it, so
	// they line up with the GPU's within a few microseconds.
	base, err := t.mark(e.cur, "origin")
	if err != nil {
		return "", 0, "", err
	}
	if err := t.evs[base].Synchronize(); err != nil {
		return "", 0, "", err
	}
	t.host0 = time.Now()
	const iters = traceIters
	for range iters {
		if err := e.both(killer, t); err != nil {
			return "", 0, "", err
		}
	}
	if err := e.dev.Synchronize(); err != nil {
		return "", 0, "", err
	}
	at := func(i int) (float64, error) {
		d, err := cuda.ElapsedTime(t.evs[base], t.evs[i])
		return us(d), err
	}
	tf := &traceFile{rank: e.rank, tracks: []string{"current stream (GEMM)", "NCCL internal stream (all_reduce)", "host"},
		meta: map[string]any{"killer": killer, "world": e.world, "gemm": e.f.gemm, "size_mb": e.f.sizeMB, "high_priority": e.f.highPriority,
			"min_ctas": e.f.minCTAs, "max_ctas": e.f.maxCTAs, "note": "kernel intervals from timing events around each kernel; host spans aligned to the GPU clock at one synchronisation"}}
	order := ""
	var gemms [][2]float64
	// Marks after the origin come in fours per iteration: ar start, ar
	// end, gemm start, gemm end.
	for it := range iters {
		i := 1 + 4*it
		var v [4]float64
		for k := range 4 {
			if v[k], err = at(i + k); err != nil {
				return "", 0, "", err
			}
		}
		tf.spans = append(tf.spans,
			span{track: 1, name: "all_reduce", start: v[0], dur: v[1] - v[0], args: map[string]any{"iteration": it, "bytes": e.buf[0].Numel() * 4}},
			span{track: 0, name: fmt.Sprintf("gemm bf16 %d^3", e.f.gemm), start: v[2], dur: v[3] - v[2], args: map[string]any{"iteration": it}})
		if it == 0 {
			order = overlapOrder(v[2], v[3], v[0], v[1])
		}
		gemms = append(gemms, [2]float64{v[2], v[3]})
	}
	gap := medianOf(gemmGaps(gemms))
	tf.meta["gemm_gap_us"] = gap
	tf.spans = append(tf.spans, t.hspans...)
	if e.f.traceDir == "" {
		return order, gap, "", nil
	}
	b, err := tf.marshal()
	if err != nil {
		return "", 0, "", err
	}
	if err := os.MkdirAll(e.f.traceDir, 0o755); err != nil {
		return "", 0, "", err
	}
	path := filepath.Join(e.f.traceDir, fmt.Sprintf("overlap_%s_rank%d.json", killer, e.rank))
	return order, gap, path, os.WriteFile(path, b, 0o644)
}
