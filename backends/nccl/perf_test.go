package nccl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// perfRow is one measured size.
type perfRow struct {
	bytes                              int
	rawUs, syncUs, asyncUs             float64 // device time per op, back-to-back
	rawHostNs, syncHostNs, asyncHostNs float64 // host time per issued op
	rawBusbw, syncBusbw                float64 // GB/s
	reps                               int
	syncDeltaUs                        []float64 // sync minus raw, per rep
}

// perfReps is how many times each small-message loop runs.
const perfReps = 7

// median of xs (which it sorts).
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// timeLoop runs issue iters times on every rank's current stream between
// two timing events and returns rank 0's device time per op and host time
// per issued op.
func timeLoop(t *testing.T, envs []*rankEnv, iters, burst int, issue func(e *rankEnv, k int) error) (float64, float64) {
	top := envs[len(envs)-1].r + 1
	dev := make([]float64, top)
	host := make([]float64, top)
	each(t, envs, func(e *rankEnv) error {
		start, _ := e.dev.NewEvent(true)
		end, _ := e.dev.NewEvent(true)
		defer start.Destroy()
		defer end.Destroy()
		e.cur.Synchronize()
		start.Record(e.cur)
		var hostTime time.Duration
		for k := 0; k < iters; {
			t0 := time.Now()
			n := min(burst, iters-k)
			for j := 0; j < n; j++ {
				if err := issue(e, k+j); err != nil {
					return err
				}
			}
			hostTime += time.Since(t0)
			k += n
			if burst < iters {
				// Keep the launch queue short so that issue cost, not
				// queue back-pressure, is what the host clock sees.
				e.cur.Synchronize()
			}
		}
		end.Record(e.cur)
		if err := end.Synchronize(); err != nil {
			return err
		}
		d, err := cuda.ElapsedTime(start, end)
		if err != nil {
			return err
		}
		dev[e.r] = float64(d.Nanoseconds()) / 1e3 / float64(iters)
		host[e.r] = float64(hostTime.Nanoseconds()) / float64(iters)
		return nil
	})
	return dev[envs[0].r], host[envs[0].r]
}

// TestPerf measures allreduce latency and bandwidth beside raw NCCL (the
// same communicator driven by a C loop) with every GPU as a rank of this
// one process, when GOCOLL_PERF=1; it writes a markdown table to
// GOCOLL_PERF_OUT.
func TestPerf(t *testing.T) {
	if os.Getenv("GOCOLL_PERF") != "1" {
		t.Skip("set GOCOLL_PERF=1")
	}
	envs := newRanks(t, 0, testOpts())
	writePerf(t, envs, len(envs), "one process, one goroutine per rank")
}

// TestPerfProcesses is TestPerf with one process per GPU, as torchrun and
// nccl-tests under mpirun run: it starts this test binary once per rank
// (TestPerfRank) around a TCPStore. GOCOLL_PERF=1 turns it on.
func TestPerfProcesses(t *testing.T) {
	if os.Getenv("GOCOLL_PERF") != "1" || os.Getenv("GOCOLL_PERF_RANK") != "" {
		t.Skip("set GOCOLL_PERF=1")
	}
	world := gpus(t)
	srv, err := store.NewTCPServer(context.Background(), store.ServerOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	exe, _ := os.Executable()
	var cmds []*exec.Cmd
	cctx, cancel := context.WithTimeout(context.Background(), 75*time.Second)
	defer cancel()
	for r := range world {
		cmd := exec.CommandContext(cctx, exe, "-test.run", "^TestPerfRank$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOCOLL_PERF_RANK=%d", r), fmt.Sprintf("GOCOLL_PERF_WORLD=%d", world),
			fmt.Sprintf("GOCOLL_PERF_STORE=127.0.0.1:%d", srv.Port()), "NCCL_DEBUG=WARN")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Error(err)
		}
	}
}

// TestPerfRank is one rank of TestPerfProcesses.
func TestPerfRank(t *testing.T) {
	rs := os.Getenv("GOCOLL_PERF_RANK")
	if rs == "" {
		t.Skip("run by TestPerfProcesses")
	}
	gpus(t)
	r, _ := strconv.Atoi(rs)
	world, _ := strconv.Atoi(os.Getenv("GOCOLL_PERF_WORLD"))
	tcp, err := store.DialTCPStore(context.Background(), os.Getenv("GOCOLL_PERF_STORE"), store.ClientOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	step := func(what string) {
		fmt.Fprintf(os.Stderr, "rank %d: %s (%s)\n", r, what, time.Now().Format("15:04:05.000"))
	}
	step("store connected")
	dev := tensor.CUDADevice(r)
	b, err := New(context.Background(), backend.Config{Store: tcp, Rank: r, WorldSize: world, GroupName: "0", GroupDesc: "perf",
		Timeout: time.Minute, Device: &dev, Options: testOpts()})
	if err != nil {
		t.Fatal(err)
	}
	step("communicator ready")
	defer b.Close(context.Background())
	d, _ := cuda.GetDevice(r)
	s, _ := d.NewStream(cuda.StreamOptions{})
	e := &rankEnv{r: r, n: world, b: b, dev: d, cur: s, ctx: cuda.WithStream(context.Background(), s)}
	out := os.Getenv("GOCOLL_PERF_OUT")
	if r != 0 || out == "" {
		t.Setenv("GOCOLL_PERF_OUT", "")
	} else {
		t.Setenv("GOCOLL_PERF_OUT", strings.TrimSuffix(out, ".md")+"-processes.md")
	}
	writePerf(t, []*rankEnv{e}, world, "one process per rank, TCPStore rendezvous")
}

func writePerf(t *testing.T, envs []*rankEnv, world int, layout string) {
	var rows []perfRow
	sizes := []int{8, 64, 512, 4 << 10, 32 << 10, 64 << 10, 1 << 20, 256 << 20, 512 << 20, 1 << 30}
	for _, size := range sizes {
		count := size / 4
		xs := make([]*tensor.Tensor, world)
		each(t, envs, func(e *rankEnv) error {
			x, err := cuda.Zeros(e.ctx, e.r, tensor.Float32, count)
			xs[e.r] = x
			return err
		})
		iters, burst := 3000, 250
		if size >= 16<<20 {
			iters, burst = 20, 20
		}
		raw := func(e *rankEnv, k int) error {
			_, err := e.b.rawAllreduce(e.ctx, xs[e.r], e.cur, 1)
			return err
		}
		syncOp := func(e *rankEnv, k int) error {
			_, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), xs[e.r:e.r+1], backend.AllreduceOptions{})
			return err
		}
		asyncOp := func(e *rankEnv, k int) error {
			w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), xs[e.r:e.r+1], backend.AllreduceOptions{Async: true})
			if err != nil {
				return err
			}
			return w.Wait(e.ctx)
		}
		// Warm up (connections, event pools), then measure.
		timeLoop(t, envs, 200, 200, raw)
		timeLoop(t, envs, 200, 200, syncOp)
		timeLoop(t, envs, 200, 200, asyncOp)
		// The three loops take turns, perfReps times below 16 MiB, and
		// each column is the median over the reps: a burst of noise on the
		// shared host then hits one rep of each, not one column.
		reps := perfReps
		if size >= 16<<20 {
			reps = 1
		}
		var dev, host [3][]float64
		for range reps {
			for i, f := range []func(*rankEnv, int) error{raw, syncOp, asyncOp} {
				d, _ := timeLoop(t, envs, iters, iters, f)
				_, h := timeLoop(t, envs, iters, burst, f)
				dev[i], host[i] = append(dev[i], d), append(host[i], h)
			}
		}
		r := perfRow{bytes: size, reps: reps,
			rawUs: median(dev[0]), syncUs: median(dev[1]), asyncUs: median(dev[2]),
			rawHostNs: median(host[0]), syncHostNs: median(host[1]), asyncHostNs: median(host[2])}
		for k := range reps {
			r.syncDeltaUs = append(r.syncDeltaUs, dev[1][k]-dev[0][k])
		}
		factor := 2 * float64(world-1) / float64(world)
		r.rawBusbw = float64(size) / (r.rawUs * 1e3) * factor
		r.syncBusbw = float64(size) / (r.syncUs * 1e3) * factor
		rows = append(rows, r)
		for _, x := range xs {
			if x != nil {
				x.Free()
			}
		}
		t.Logf("%d B: raw %.2f us, gocoll sync %.2f us, async+wait %.2f us; host ns/op raw %.0f sync %.0f async %.0f",
			size, r.rawUs, r.syncUs, r.asyncUs, r.rawHostNs, r.syncHostNs, r.asyncHostNs)
	}
	var sb strings.Builder
	name, _ := envs[0].dev.Name()
	fmt.Fprintf(&sb, "allreduce float32 sum, in place, %d ranks (%s), %s, NCCL %s (%s); rank %d's view\n\n", world, layout, name, VersionString(lib.version), LibraryPath(), envs[0].r)
	sb.WriteString("Medians over the reps; the last column is sync minus raw in each rep, sorted.\n\n")
	sb.WriteString("| bytes | reps | raw NCCL us/op | gocoll sync us/op | gocoll async+Wait us/op | raw host ns/call | gocoll sync host ns/call | gocoll async+Wait host ns/call | raw busbw GB/s | gocoll busbw GB/s | busbw ratio | sync - raw us per rep |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ratio := 0.0
		if r.rawBusbw > 0 {
			ratio = r.syncBusbw / r.rawBusbw
		}
		slices.Sort(r.syncDeltaUs)
		deltas := make([]string, len(r.syncDeltaUs))
		for i, d := range r.syncDeltaUs {
			deltas[i] = fmt.Sprintf("%+.2f", d)
		}
		fmt.Fprintf(&sb, "| %d | %d | %.2f | %.2f | %.2f | %.0f | %.0f | %.0f | %.1f | %.1f | %.3f | %s |\n", r.bytes, r.reps, r.rawUs, r.syncUs, r.asyncUs,
			r.rawHostNs, r.syncHostNs, r.asyncHostNs, r.rawBusbw, r.syncBusbw, ratio, strings.Join(deltas, " "))
	}
	if p := os.Getenv("GOCOLL_PERF_OUT"); p != "" {
		os.WriteFile(p, []byte(sb.String()), 0o644)
	}
	t.Log("\n" + sb.String())
}

// BenchmarkAsyncAllreduceHostCost is the host CPU cost of one async
// allreduce call plus its Wait (8 bytes), every rank issuing; the launch
// queue is drained every 256 calls outside the measured time.
func BenchmarkAsyncAllreduceHostCost(b *testing.B) {
	envs := newRanks(b, 0, testOpts())
	xs := make([]*tensor.Tensor, len(envs))
	for _, e := range envs {
		xs[e.r], _ = cuda.Zeros(e.ctx, e.r, tensor.Float32, 2)
	}
	host := make([]time.Duration, len(envs))
	// Steady state, as in a training loop: the first b.N ops of a new
	// backend would find the event pool empty and create their end events
	// (about 0.6 us each), since the watchdog returns events only as it
	// retires works, every 100 ms. Issue as many first and let it retire
	// them.
	each(b, envs, func(e *rankEnv) error {
		for k := range b.N {
			w, err := e.b.Allreduce(e.ctx, backend.Meta{Op: backend.OpAllreduce, Seq: uint64(k)}, xs[e.r:e.r+1], backend.AllreduceOptions{Async: true})
			if err != nil {
				return err
			}
			if err := w.Wait(e.ctx); err != nil {
				return err
			}
		}
		return e.cur.SynchronizeContext(context.Background())
	})
	time.Sleep(3 * testOpts().WatchdogInterval)
	b.ReportAllocs()
	b.ResetTimer()
	each(b, envs, func(e *rankEnv) error {
		for k := 0; k < b.N; {
			t0 := time.Now()
			for j := 0; j < 256 && k < b.N; j, k = j+1, k+1 {
				w, err := e.b.Allreduce(e.ctx, backend.Meta{Op: backend.OpAllreduce, Seq: uint64(k)}, xs[e.r:e.r+1], backend.AllreduceOptions{Async: true})
				if err != nil {
					return err
				}
				if err := w.Wait(e.ctx); err != nil {
					return err
				}
			}
			host[e.r] += time.Since(t0)
			e.cur.SynchronizeContext(context.Background())
		}
		return nil
	})
	b.ReportMetric(float64(host[0].Nanoseconds())/float64(b.N), "host-ns/call")
	// NCCL's own share: the same call from a C loop, no events, no Go.
	b.StopTimer()
	raw := make([]time.Duration, len(envs))
	each(b, envs, func(e *rankEnv) error {
		for k := 0; k < b.N; k += 256 {
			d, err := e.b.rawAllreduce(e.ctx, xs[e.r], e.cur, min(256, b.N-k))
			if err != nil {
				return err
			}
			raw[e.r] += d
			e.cur.SynchronizeContext(context.Background())
		}
		return nil
	})
	b.ReportMetric(float64(raw[0].Nanoseconds())/float64(b.N), "raw-nccl-host-ns/call")
}
