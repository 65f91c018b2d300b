package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

// benchVal is the input pattern: element i of rank r. Small integers, so
// that float32 sums over any world size here are exact and a check can
// compare for equality.
func benchVal(r, i int) float32 { return float32((r*7+i)%23 + 1) }

// benchCase is one mode of one op at one size, for one rank: the input
// and output views, and what the output must hold afterwards.
type benchCase struct {
	op       string
	in, out  *tensor.Tensor
	count    int  // nccl-tests' count (opCount)
	part     int  // count / n: the per-rank piece of the split ops
	peer     int  // sendrecv: the rank sent to; the one received from is (r-1+n)%n
	inPlace  bool //
	r, n     int
	rootOnly bool // reduce: only the root's output is defined
	// ins and outs are in and out as one-tensor lists, built once so
	// that the timed loop allocates none per op.
	ins, outs []*tensor.Tensor
	// spare are the same layout over other buffers, for the host
	// backends' timed loop (see pgRunner.run); empty on the GPU.
	spare []*benchCase
}

// expect is the value out[i] must hold after the op.
func (c *benchCase) expect(i int) float32 {
	sum := func(j int) float32 {
		var s float32
		for q := range c.n {
			s += benchVal(q, j)
		}
		return s
	}
	switch c.op {
	case opAllreduce, opReduce:
		return sum(i)
	case opAllgather:
		return benchVal(i/c.part, i%c.part)
	case opReduceScatter:
		return sum(c.r*c.part + i)
	case opBroadcast:
		return benchVal(0, i)
	case opAlltoall:
		return benchVal(i/c.part, c.r*c.part+i%c.part)
	case opSendrecv:
		return benchVal((c.r-1+c.n)%c.n, i)
	}
	panic("conftest bench: no expectation for " + c.op)
}

// newCase lays out op's buffers for count elements over send and recv
// (each at least count long); inPlace picks nccl-tests' in-place layout
// (the input is the output, or the rank's piece of it, or contains it).
func newCase(op string, send, recv *tensor.Tensor, count, r, n int, inPlace bool) (*benchCase, error) {
	c := &benchCase{op: op, count: count, part: count / n, r: r, n: n, inPlace: inPlace, peer: (r + 1) % n, rootOnly: op == opReduce}
	view := func(t *tensor.Tensor, start, k int) *tensor.Tensor {
		v, err := t.Narrow(start, k)
		if err != nil {
			panic(err) // the buffers are sized for the largest count
		}
		return v
	}
	whole := view(recv, 0, count)
	switch op {
	case opAllreduce, opBroadcast, opReduce, opAlltoall, opSendrecv:
		c.in, c.out = view(send, 0, count), whole
		if inPlace {
			c.in = whole
		}
	case opAllgather:
		c.in, c.out = view(send, 0, c.part), whole
		if inPlace {
			c.in = view(recv, r*c.part, c.part)
		}
	case opReduceScatter:
		c.in, c.out = view(send, 0, count), view(recv, 0, c.part)
		if inPlace {
			c.in, c.out = whole, view(recv, r*c.part, c.part)
		}
	default:
		return nil, fmt.Errorf("no op %q", op)
	}
	c.ins, c.outs = []*tensor.Tensor{c.in}, []*tensor.Tensor{c.out}
	return c, nil
}

// newCases is newCase over the first buffer pair, with the other pairs
// as its spares.
func newCases(op string, sends, recvs []*tensor.Tensor, count, r, n int, inPlace bool) (*benchCase, error) {
	c, err := newCase(op, sends[0], recvs[0], count, r, n, inPlace)
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(sends); i++ {
		sc, err := newCase(op, sends[i], recvs[i], count, r, n, inPlace)
		if err != nil {
			return nil, err
		}
		c.spare = append(c.spare, sc)
	}
	return c, nil
}

// hostWindow is how many buffer pairs a host backend's timed loop
// rotates over: up to 4, within 512 MiB per rank.
func hostWindow(maxBytes int) int {
	return max(1, min(4, (512<<20)/max(1, 2*maxBytes)))
}

// benchDevice hides where the buffers live: host memory, or one GPU
// (cuda), with ctx's current stream.
type benchDevice struct {
	dev     *cuda.Device // nil: host
	pattern []float32    // benchVal(rank, i), grown on demand: every size's input is a prefix
}

func (d *benchDevice) alloc(ctx context.Context, n int) (*tensor.Tensor, error) {
	if d.dev == nil {
		return tensor.New(tensor.Float32, n), nil
	}
	return cuda.Empty(ctx, d.dev.Ordinal(), tensor.Float32, n)
}

// write sets t to vals.
func (d *benchDevice) write(ctx context.Context, t *tensor.Tensor, vals []float32) error {
	if d.dev == nil {
		copy(unsafe.Slice((*float32)(t.HostPtr()), t.Numel()), vals)
		return nil
	}
	if len(vals) == 0 {
		return nil
	}
	s := cuda.StreamFor(ctx, d.dev)
	if err := s.CopyHtoD(t.Ptr(), unsafe.Pointer(&vals[0]), 4*len(vals)); err != nil {
		return err
	}
	return s.Synchronize()
}

// read returns t's elements.
func (d *benchDevice) read(ctx context.Context, t *tensor.Tensor) ([]float32, error) {
	if d.dev == nil {
		return unsafe.Slice((*float32)(t.HostPtr()), t.Numel()), nil
	}
	h, err := cuda.ToHost(ctx, t)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(h.HostPtr()), h.Numel()), nil
}

// sync waits for what ctx's current stream holds (nothing on the host).
func (d *benchDevice) sync(ctx context.Context) error {
	if d.dev == nil {
		return nil
	}
	return cuda.StreamFor(ctx, d.dev).Synchronize()
}

// sentinel is what prepare puts in the outputs: -1, which no op computes
// from the positive inputs.
const sentinel = float32(-1)

// prepare fills the case's output with the sentinel (so that a stale
// right answer from an earlier run cannot pass the check) and then its
// input with the rank's pattern.
func (d *benchDevice) prepare(ctx context.Context, c *benchCase) error {
	if d.dev == nil {
		out := unsafe.Slice((*float32)(c.out.HostPtr()), c.out.Numel())
		for i := range out {
			out[i] = sentinel
		}
	} else if err := cuda.StreamFor(ctx, d.dev).Memset32(c.out.Ptr(), math.Float32bits(sentinel), c.out.Numel()); err != nil {
		return err
	}
	for i := len(d.pattern); i < c.in.Numel(); i++ {
		d.pattern = append(d.pattern, benchVal(c.r, i))
	}
	return d.write(ctx, c.in, d.pattern[:c.in.Numel()])
}

// verify counts the output elements that differ from expect.
func (d *benchDevice) verify(ctx context.Context, c *benchCase) (int64, error) {
	if c.rootOnly && c.r != 0 {
		return 0, nil
	}
	got, err := d.read(ctx, c.out)
	if err != nil {
		return 0, err
	}
	return countWrong(c, got), nil
}

// countWrong compares got with the case's expectation, in parallel
// chunks for the large buffers (a GiB is 256 Mi elements).
func countWrong(c *benchCase, got []float32) int64 {
	const chunk = 1 << 22
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for lo := 0; lo < len(got); lo += chunk {
		hi := min(lo+chunk, len(got))
		wg.Go(func() {
			var w int64
			for i := lo; i < hi; i++ {
				if got[i] != c.expect(i) {
					w++
				}
			}
			wrong.Add(w)
		})
	}
	wg.Wait()
	return wrong.Load()
}

// benchRunner issues one op of a case and waits for a batch of them: the
// backend through the dispatcher, or the raw NCCL loop.
type benchRunner interface {
	name() string
	// supports says whether the runner has the mode (c10d has no
	// out-of-place allreduce, for one).
	supports(op string, inPlace bool, n int) bool
	// run issues iters ops of c back to back and waits for all of them
	// once, at the end.
	run(ctx context.Context, c *benchCase, iters int) error
}

// pgRunner runs ops through the dispatcher's ProcessGroup.
type pgRunner struct {
	series string
	pg     *dispatcher.ProcessGroup
	dev    *benchDevice
	depth  int // --depth: ops in flight on the host (0: one per buffer pair)
	// blocking: at depth 1, call the blocking forms (--blocking).
	blocking bool
	// slots and works are run's scratch, kept between runs so that a
	// timed batch allocates nothing: the buffer pairs in turn, and the
	// Works of the op in flight on each (two for sendrecv).
	slots []*benchCase
	works [][2]backend.Work
	all   [][2]backend.Work // the GPU's: every op of the batch
}

func (p *pgRunner) name() string { return p.series }

func (p *pgRunner) supports(op string, inPlace bool, n int) bool {
	switch op {
	case opAllreduce, opBroadcast, opReduce:
		return inPlace
	case opAlltoall:
		return !inPlace
	case opSendrecv:
		return !inPlace && n > 1 // c10d refuses a send to oneself
	}
	return true
}

// issue queues one op of c and returns its Works (the second only for
// sendrecv).
func (p *pgRunner) issue(ctx context.Context, c *benchCase) (w [2]backend.Work, err error) {
	switch c.op {
	case opAllreduce:
		w[0], err = p.pg.Allreduce(ctx, c.outs, backend.AllreduceOptions{})
	case opAllgather:
		w[0], err = p.pg.AllgatherIntoTensor(ctx, c.out, c.in, backend.AllgatherIntoTensorOptions{})
	case opReduceScatter:
		w[0], err = p.pg.ReduceScatterTensor(ctx, c.out, c.in, backend.ReduceScatterTensorOptions{})
	case opBroadcast:
		w[0], err = p.pg.Broadcast(ctx, c.outs, backend.BroadcastOptions{})
	case opReduce:
		w[0], err = p.pg.Reduce(ctx, c.outs, backend.ReduceOptions{})
	case opAlltoall:
		w[0], err = p.pg.AlltoallBase(ctx, c.out, c.in, backend.AlltoallBaseOptions{})
	case opSendrecv:
		// Even ranks send first, odd ranks receive first, so that a
		// backend whose sends block until matched cannot deadlock.
		if c.r%2 == 0 {
			if w[0], err = p.pg.Send(ctx, c.ins, c.peer, backend.SendOptions{}); err == nil {
				w[1], err = p.pg.Recv(ctx, c.outs, (c.r-1+c.n)%c.n, backend.RecvOptions{})
			}
		} else if w[0], err = p.pg.Recv(ctx, c.outs, (c.r-1+c.n)%c.n, backend.RecvOptions{}); err == nil {
			w[1], err = p.pg.Send(ctx, c.ins, c.peer, backend.SendOptions{})
		}
	default:
		err = fmt.Errorf("no op %q", c.op)
	}
	return w, err
}

// issueWait runs one op of c through the dispatcher's blocking form
// (AllreduceWait, ...: c10d's async_op=False), which returns no Work;
// sendrecv, a pair of ops, is issued and waited for.
func (p *pgRunner) issueWait(ctx context.Context, c *benchCase) error {
	switch c.op {
	case opAllreduce:
		return p.pg.AllreduceWait(ctx, c.outs, backend.AllreduceOptions{})
	case opAllgather:
		return p.pg.AllgatherIntoTensorWait(ctx, c.out, c.in, backend.AllgatherIntoTensorOptions{})
	case opReduceScatter:
		return p.pg.ReduceScatterTensorWait(ctx, c.out, c.in, backend.ReduceScatterTensorOptions{})
	case opBroadcast:
		return p.pg.BroadcastWait(ctx, c.outs, backend.BroadcastOptions{})
	case opReduce:
		return p.pg.ReduceWait(ctx, c.outs, backend.ReduceOptions{})
	case opAlltoall:
		return p.pg.AlltoallBaseWait(ctx, c.out, c.in, backend.AlltoallBaseOptions{})
	}
	w, err := p.issue(ctx, c)
	if err != nil {
		return err
	}
	return wait(ctx, &w)
}

// wait waits for the Works of one slot, in issue order, and clears it.
func wait(ctx context.Context, ws *[2]backend.Work) error {
	for k, w := range ws {
		if w != nil {
			ws[k] = nil
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// run is nccl-tests' timed loop: iters ops queued back to back, one wait
// at the end, and nothing else in the loop (no allocation, no clock read).
//
// On the GPU one stream orders the ops, so, as nccl-tests synchronizes
// its stream once, the loop waits only for the last op and syncs the
// current stream; every earlier op has then completed, and its Work's
// Exception (a flag read) says whether it failed. On the host, a backend
// runs queued ops concurrently (cpupool's workers, UCC's progress), so
// two queued ops on one buffer would race: the loop rotates over the
// case and its spares, and before it reuses a buffer pair it waits for
// the op that last used it. With as many pairs as the backend runs ops at
// once, that wait never starves the backend, and the timing is that of
// an unbounded queue. --depth N uses only the first N pairs, so that
// --depth 1 works on one buffer, as MPI_Allreduce's loop and nccl-tests
// do: more pairs than ops in flight would only add to the working set.
func (p *pgRunner) run(ctx context.Context, c *benchCase, iters int) error {
	if p.dev.dev != nil {
		return p.runStream(ctx, c, iters)
	}
	if p.depth == 1 && p.blocking {
		for range iters {
			if err := p.issueWait(ctx, c); err != nil {
				return err
			}
		}
		return nil
	}
	p.slots = append(append(p.slots[:0], c), c.spare...)
	window := len(p.slots)
	if p.depth > 0 {
		window = p.depth // checked against the pairs by benchRank
	}
	if cap(p.works) < window {
		p.works = make([][2]backend.Work, window)
	}
	works := p.works[:window]
	var err error
	for i := range iters {
		k := i % window
		if err = wait(ctx, &works[k]); err != nil {
			break
		}
		if works[k], err = p.issue(ctx, p.slots[k]); err != nil {
			break
		}
	}
	for k := range works {
		// Oldest first, where the ring wrapped.
		if werr := wait(ctx, &works[(iters+k)%window]); err == nil {
			err = werr
		}
	}
	return err
}

// runStream is run on the GPU: no spares, one stream.
func (p *pgRunner) runStream(ctx context.Context, c *benchCase, iters int) error {
	p.all = p.all[:0]
	var last [2]backend.Work
	var err error
	for range iters {
		if last, err = p.issue(ctx, c); err != nil {
			break
		}
		p.all = append(p.all, last)
	}
	if werr := wait(ctx, &last); err == nil {
		err = werr
	}
	if serr := p.dev.sync(ctx); err == nil {
		err = serr
	}
	for k := range p.all {
		for _, w := range p.all[k] {
			if w != nil && err == nil {
				err = w.Exception()
			}
		}
	}
	clear(p.all) // keep no Work alive between runs
	return err
}

// benchRankFlags are the flags of one rank of conftest bench.
type benchRankFlags struct {
	backend    string
	ops        string
	sizes      string
	iters      int
	warmup     int
	check      bool
	scale      float64
	threads    int
	cpuprofile string
	rawNCCL    bool
	depth      int
	blocking   bool
	prewarm    int
	opts       cpupool.Options
}

// benchRank is one rank of conftest bench: per op and size, -w warm-up
// iterations, a barrier, -n iterations queued back to back and waited for
// once, and with -c a fresh input, one more op and a check of every
// output element; out-of-place, then in-place. It prints one BENCH2 line
// per op and size. With --raw-nccl it runs the same on the backend's own
// NCCL communicator straight from C after each of ours (series raw-nccl).
func benchRank(args []string) error {
	fs := flag.NewFlagSet("conftest bench-rank", flag.ExitOnError)
	var f benchRankFlags
	fs.StringVar(&f.backend, "backend", cpupool.Name, "the backend: cpupool, ucc or nccl")
	fs.StringVar(&f.ops, "op", opAllreduce, "ops, comma-separated")
	fs.StringVar(&f.sizes, "sizes", "8", "message sizes in bytes, comma-separated")
	fs.IntVar(&f.iters, "n", 20, "timed iterations (0: the adaptive count, scaled by --iters)")
	fs.IntVar(&f.warmup, "w", 5, "warm-up iterations (with -n 0: a tenth of the count)")
	fs.BoolVar(&f.check, "c", false, "check the results")
	fs.Float64Var(&f.scale, "iters", 1, "with -n 0: scale the adaptive iteration counts")
	fs.IntVar(&f.threads, "threads", 2, "cpupool worker threads")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "rank 0 writes a pprof CPU profile of the timed loops here; with {rank} in the path, every rank writes its own")
	fs.BoolVar(&f.blocking, "blocking", true, "host backends, --depth 1: call the dispatcher's blocking forms (AllreduceWait, ...: c10d's default async_op=False, MPI_Allreduce's semantics), which return no Work, so that the backend may reuse the op's record; false: the async form and Work.Wait")
	fs.IntVar(&f.depth, "depth", 0, "host backends: ops in flight before the timed loop waits for the oldest (0: one per buffer pair, up to 4; N: only the first N pairs, N ops in flight; 1: each op waited for before the next on one buffer, a blocking loop like MPI_Allreduce's)")
	fs.IntVar(&f.prewarm, "prewarm", 2, "host backends: before the first size, run 8 B allreduces until every rank's Go runtime has finished this many garbage collections (0: none; see prewarm)")
	fs.BoolVar(&f.rawNCCL, "raw-nccl", false, "with --backend nccl: also raw NCCL calls on the same communicator")
	fs.IntVar(&f.opts.SegmentBytes, "segment", 0, "cpupool SegmentBytes (0: default)")
	fs.IntVar(&f.opts.SmallBytes, "small", 0, "cpupool SmallBytes (0: default)")
	fs.IntVar(&f.opts.LaneBytes, "lane", 0, "cpupool LaneBytes (0: default)")
	fs.IntVar(&f.opts.RawLaneBytes, "rawlanes", 0, "cpupool RawLaneBytes (0: default, off)")
	fs.IntVar(&f.opts.Window, "window", 0, "cpupool Window (0: default)")
	fs.StringVar(&f.opts.LaneCopies, "lanecopies", "", "cpupool LaneCopies: auto, cached or streamed (empty: default)")
	fs.IntVar(&f.opts.SocketBufferBytes, "sockbuf", 0, "cpupool SocketBufferBytes (0: kernel autotuning)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ops, err := parseOps(f.ops)
	if err != nil {
		return err
	}
	var sizes []int
	for _, s := range strings.Split(f.sizes, ",") {
		b, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("bad --sizes %q: %w", f.sizes, err)
		}
		sizes = append(sizes, b)
	}
	f.opts.Threads = f.threads
	ctx := context.Background()
	cfg := dispatcher.Config{Backend: f.backend, Timeout: 5 * time.Minute,
		BackendOptions: map[string]any{cpupool.Name: &f.opts}}
	dev := &benchDevice{}
	if f.backend == nccl.Name {
		local, err := strconv.Atoi(cmp.Or(os.Getenv("LOCAL_RANK"), "0"))
		if err != nil {
			return fmt.Errorf("LOCAL_RANK: %w", err)
		}
		if dev.dev, err = cuda.GetDevice(local); err != nil {
			return err
		}
		d := tensor.CUDADevice(local)
		cfg.Device = &d
	}
	pg, err := dispatcher.InitFromEnv(ctx, cfg)
	if err != nil {
		return err
	}
	defer pg.Close(ctx)
	runners := []benchRunner{&pgRunner{series: f.backend, pg: pg, dev: dev, depth: f.depth, blocking: f.blocking}}
	if f.rawNCCL {
		raw, err := newRawNCCL(ctx, pg, dev)
		if err != nil {
			return err
		}
		runners = append(runners, raw)
	}
	if f.prewarm > 0 && dev.dev == nil {
		if err := prewarm(ctx, pg, uint64(f.prewarm)); err != nil {
			return fmt.Errorf("pre-warm: %w", err)
		}
	}
	if prof := strings.ReplaceAll(f.cpuprofile, "{rank}", strconv.Itoa(pg.Rank())); prof != "" && (pg.Rank() == 0 || prof != f.cpuprofile) {
		stop, err := startCPUProfile(prof)
		if err != nil {
			return err
		}
		defer stop()
	}
	r, n := pg.Rank(), pg.Size()
	maxBytes := 0
	for _, b := range sizes {
		maxBytes = max(maxBytes, b)
	}
	pairs := 1
	if dev.dev == nil {
		pairs = hostWindow(maxBytes)
	}
	if f.depth < 0 || f.depth > pairs || (f.depth > 0 && dev.dev != nil) {
		return fmt.Errorf("bad --depth %d: 0, or 1 to %d (the buffer pairs of sizes up to %d B) on the host", f.depth, pairs, maxBytes)
	}
	var sends, recvs []*tensor.Tensor
	for range pairs {
		for _, l := range []*[]*tensor.Tensor{&sends, &recvs} {
			t, err := dev.alloc(ctx, maxBytes/4)
			if err != nil {
				return err
			}
			defer t.Free()
			*l = append(*l, t)
		}
	}
	// The buffers just allocated (up to 2 × pairs × maxBytes: 256 MiB for
	// a table up to 64 MiB) take the heap far past the collector's goal,
	// and the collection that starts ran through the first size's timed
	// loop: its mark workers and stops took the CPU from a spinning rank
	// (2 ranks on 2 cores: 8 B at 1.6 µs against 0.9 without the large
	// sizes; docs/perf.md, issue 17, eighteenth pass). Collect now, as C
	// peers have no collector to wait for; the ops allocate next to
	// nothing, so the goal this leaves is not reached again.
	runtime.GC()
	for _, op := range ops {
		for _, b := range sizes {
			count := opCount(op, b, n)
			if count == 0 {
				continue // too small to split over n ranks
			}
			iters, warm := f.iters, f.warmup
			if iters == 0 {
				iters = max(3, int(f.scale*float64(min(2000, max(5, (256<<20)/b)))))
				warm = max(2, iters/10)
			}
			for _, run := range runners {
				var us [2]float64
				var wrong [2]int64
				for m, inPlace := range []bool{false, true} {
					us[m], wrong[m] = math.NaN(), -1
					if !run.supports(op, inPlace, n) {
						continue
					}
					c, err := newCases(op, sends, recvs, count, r, n, inPlace)
					if err != nil {
						return err
					}
					if us[m], wrong[m], err = measure(ctx, pg, dev, run, c, iters, warm, f.check); err != nil {
						return fmt.Errorf("%s %s %d B (%s): %w", run.name(), op, b, modeName(inPlace), err)
					}
				}
				fmt.Println(formatBenchLine(run.name(), op, r, int64(count*4), int64(count), us[0], wrong[0], us[1], wrong[1]))
			}
		}
	}
	return nil
}

func modeName(inPlace bool) string {
	if inPlace {
		return "in-place"
	}
	return "out-of-place"
}

// measure is nccl-tests' loop for one case: warm-up, barrier, the timed
// batch (queued back to back, one wait at the end), and with check a
// fresh input, one op and the count of wrong elements (-1 unchecked).
func measure(ctx context.Context, pg *dispatcher.ProcessGroup, dev *benchDevice, run benchRunner, c *benchCase, iters, warm int, check bool) (float64, int64, error) {
	// Every buffer pair the timed loop rotates over, not only the first:
	// the pairs are sized for the largest size and never touched before,
	// so with fewer warm-up ops than pairs (2 at 16 MiB, 4 pairs) the
	// first ops on the others fault their pages in inside the timed loop,
	// on this rank and, through UCC's CMA reads, on its peers. The raw
	// libucc loop and Open MPI's fill all their buffers before timing.
	for _, s := range append([]*benchCase{c}, c.spare...) {
		if err := dev.prepare(ctx, s); err != nil {
			return 0, 0, err
		}
	}
	if err := run.run(ctx, c, warm); err != nil {
		return 0, 0, err
	}
	if err := barrier(ctx, pg); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := run.run(ctx, c, iters); err != nil {
		return 0, 0, err
	}
	us := float64(time.Since(start).Nanoseconds()) / 1e3 / float64(iters)
	wrong := int64(-1)
	if check {
		if err := barrier(ctx, pg); err != nil {
			return 0, 0, err
		}
		if err := dev.prepare(ctx, c); err != nil {
			return 0, 0, err
		}
		// Every rank's input must be in place before any rank's op reads
		// it over the wire.
		if err := barrier(ctx, pg); err != nil {
			return 0, 0, err
		}
		if err := run.run(ctx, c, 1); err != nil {
			return 0, 0, err
		}
		var err error
		if wrong, err = dev.verify(ctx, c); err != nil {
			return 0, 0, err
		}
	}
	return us, wrong, nil
}

// Pre-warm bounds: ops per round, and the rounds after which the ranks go
// on whatever their collections (a process whose heap never grows).
const (
	prewarmRound  = 500
	prewarmRounds = 400
)

// prewarm runs 8 B allreduces, each waited for, in rounds of
// prewarmRound, until every rank's Go runtime has finished gcs garbage
// collections since the pre-warm began (the ranks agree after each round
// with a MIN allreduce of their verdicts), or prewarmRounds have passed.
//
// Why: a fresh Go process takes every allocation from fresh pages until
// its heap first reaches the collector's goal (4 MiB by default) and a
// collection frees memory for reuse. The first write to a fresh page
// faults, 1–2 µs on bare metal and 13–17 µs on the 2-core VMs of
// docs/perf.md, and a small host op allocates its Work (cpupool 168 B,
// ucc 132 B): the first ~20 000 ops of a process then paid several µs
// each in page faults, and the first sizes of a table (2000 ops each)
// measured the process's start, not the op (issue 17, eleventh pass). A
// program that has run for a while, as a training loop has, reuses its
// heap; C peers (Open MPI, the raw libucc loop) allocate nothing per op.
// The cost is paid once per process, as a JIT's warm-up is, and
// --tune '--prewarm 0' measures without it.
func prewarm(ctx context.Context, pg *dispatcher.ProcessGroup, gcs uint64) error {
	sample := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	cycles := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	allreduce := func(t *tensor.Tensor, op backend.ReduceOp) error {
		w, err := pg.Allreduce(ctx, []*tensor.Tensor{t}, backend.AllreduceOptions{ReduceOp: op})
		if err != nil {
			return err
		}
		return w.Wait(ctx)
	}
	goal := cycles() + gcs
	buf := tensor.New(tensor.Float32, 2)
	flag := tensor.New(tensor.Float32, 1)
	for range prewarmRounds {
		for range prewarmRound {
			if err := allreduce(buf, backend.SUM); err != nil {
				return err
			}
		}
		done := 0.0
		if cycles() >= goal {
			done = 1
		}
		flag.Fill(done)
		if err := allreduce(flag, backend.MIN); err != nil {
			return err
		}
		if flag.At(0) == 1 {
			return nil
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

var errNoRawNCCL = errors.New("--raw-nccl needs --backend nccl")

// startCPUProfile writes a CPU profile of this process to path until stop
// is called (the --cpuprofile flags of bench and bench hostcost).
func startCPUProfile(path string) (stop func(), err error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); pf.Close() }, nil
}
