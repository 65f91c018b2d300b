package cpupool_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/internal/coll"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// TestLaneAllreduce runs the lane fast path (every peer in shared memory,
// buffers up to SmallBytes) at world sizes 2, 3 (the fold of recursive
// doubling) and 4, and the flat exchange at 3 and 4, for every dtype and every reduce op the dtype takes,
// with odd lengths so that frames pad; values are small integers, so
// every order of combining gives the exact answer, which is computed here
// independently of the kernels. It also checks that several tensors in
// one call, and the SUM of many consecutive ops (tags in a row on the
// lanes, stragglers none), come out right.
func TestLaneAllreduce(t *testing.T) {
	ctx := context.Background()
	ops := []reduceop.ReduceOp{backend.SUM, backend.PRODUCT, backend.MIN, backend.MAX, backend.AVG, backend.BAND, backend.BOR, backend.BXOR}
	for _, c := range []struct {
		n    int
		flat bool // coll.AllreduceLanesFlat, as with more ranks than cores
	}{{2, false}, {3, false}, {4, false}, {3, true}, {4, true}} {
		n := c.n
		bs := group(t, n, &cpupool.Options{Transport: "shm"})
		for _, b := range bs {
			cpupool.SetFlatLanes(b, c.flat)
		}
		for _, dt := range tensor.DTypes() {
			for _, op := range ops {
				if op.ValidFor(dt) != nil || (dt == tensor.Bool && op.Type == reduceop.Avg) {
					continue // bool's AVG is the ring's kernel too: collectives_test covers it
				}
				each(t, bs, func(r int, b backend.Backend) error {
					val := func(rank, i int) float64 {
						if dt == tensor.Bool {
							return float64((i + rank) % 2)
						}
						return float64((i+rank)%3 + 1)
					}
					return checkLaneValues(ctx, b, dt, op, n, r, 37, val)
				})
			}
		}
		each(t, bs, func(r int, b backend.Backend) error {
			xs := []*tensor.Tensor{tensor.New(tensor.Int64, 5), tensor.New(tensor.Int64, 5)}
			for k := range 200 {
				xs[0].Fill(float64(r + k))
				xs[1].Fill(1)
				w, err := b.Allreduce(ctx, backend.Meta{Timeout: 20 * time.Second}, xs, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
				want := float64(n*(n-1)/2 + n*k + n)
				for _, x := range xs {
					if got := x.At(4); got != want {
						return fmt.Errorf("world %d rank %d op %d: %v, want %v", n, r, k, got, want)
					}
				}
			}
			return nil
		})
	}
}

// laneExpect is op over the n ranks' values, as the dtype holds it.
func laneExpect(dt tensor.DType, op reduceop.ReduceOp, n int, v func(rank int) float64) float64 {
	acc := v(0)
	for r := 1; r < n; r++ {
		x := v(r)
		switch op.Type {
		case reduceop.Sum, reduceop.Avg:
			acc += x
		case reduceop.Product:
			acc *= x
		case reduceop.Min:
			acc = math.Min(acc, x)
		case reduceop.Max:
			acc = math.Max(acc, x)
		case reduceop.BAnd:
			acc = float64(int64(acc) & int64(x))
		case reduceop.BOr:
			acc = float64(int64(acc) | int64(x))
		case reduceop.BXor:
			acc = float64(int64(acc) ^ int64(x))
		}
	}
	if op.Type == reduceop.Avg {
		acc /= float64(n)
		if !dt.IsFloat() {
			acc = math.Trunc(acc)
		}
	}
	// Narrow floats round the result (every partial result of these
	// values before the last combine is exact): compare what the dtype
	// holds.
	t, _ := tensor.FromFloat64s(dt, []float64{acc})
	return t.At(0)
}

// TestLaneMismatch: ranks that disagree on a lane op (the dtype, or the
// size, including a size that sends one rank the slow way) fail on every
// rank with ErrInvalidArgument, quickly, and the group goes on working.
func TestLaneMismatch(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		dts   []tensor.DType
		elems []int
	}{
		{"dtype", []tensor.DType{tensor.Float32, tensor.Int32}, []int{8, 8}},
		{"size", []tensor.DType{tensor.Float32, tensor.Float32, tensor.Float32}, []int{8, 8, 9}},
		{"lane vs ring", []tensor.DType{tensor.Float32, tensor.Float32}, []int{8, 1 << 18}},
		// The flat exchange over the board (4 ranks): against itself, a
		// rank whose size sends it over the lanes, and one whose size
		// sends it over the rings.
		{"board dtype", []tensor.DType{tensor.Float32, tensor.Float32, tensor.Int32, tensor.Float32}, []int{8, 8, 8, 8}},
		{"board vs lanes", []tensor.DType{tensor.Float32, tensor.Float32, tensor.Float32, tensor.Float32}, []int{8, 8, 8, 512}},
		{"lanes vs board", []tensor.DType{tensor.Float32, tensor.Float32, tensor.Float32, tensor.Float32}, []int{512, 8, 8, 8}},
		{"board vs ring", []tensor.DType{tensor.Float32, tensor.Float32, tensor.Float32, tensor.Float32}, []int{8, 1 << 18, 8, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := group(t, len(tc.elems), &cpupool.Options{Transport: "shm"})
			if len(bs) == 4 {
				for _, b := range bs {
					cpupool.SetFlatLanes(b, true)
				}
				if !cpupool.HasBoard(bs[0]) {
					t.Fatal("4 ranks on shared memory and no board")
				}
			}
			refusedAllreduce(ctx, t, bs, func(r int) *tensor.Tensor { return tensor.New(tc.dts[r], tc.elems[r]) })
			// Twice: the first op after a failure posts into a slot that
			// a peer may still read (the board's wait), the second
			// overwrites the other one.
			checkUsable(ctx, t, bs, backend.Meta{Timeout: 15 * time.Second})
			checkUsable(ctx, t, bs, backend.Meta{Timeout: 15 * time.Second})
		})
	}
}

// TestBoardPeerDeath: a rank of 4 that dies while its peers wait for its
// board message is named by them (ErrRemote) within seconds.
func TestBoardPeerDeath(t *testing.T) {
	ctx := context.Background()
	bs := group(t, 4, &cpupool.Options{Transport: "shm"})
	for _, b := range bs {
		cpupool.SetFlatLanes(b, true)
	}
	checkUsable(ctx, t, bs, backend.Meta{Timeout: 15 * time.Second})
	ws := make([]backend.Work, 3)
	for r := range 3 {
		w, err := bs[r].Allreduce(ctx, backend.Meta{Timeout: time.Minute}, []*tensor.Tensor{tensor.New(tensor.Float32, 2)}, backend.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ws[r] = w
	}
	errs := make(chan error, 3)
	for _, w := range ws {
		go func() { errs <- w.Wait(ctx) }()
	}
	time.Sleep(50 * time.Millisecond)
	_ = bs[3].Abort(ctx, errors.New("simulated crash"))
	for range 3 {
		select {
		case err := <-errs:
			var oe *backend.OpError
			if !errors.Is(err, backend.ErrRemote) || !errors.As(err, &oe) || len(oe.Ranks) == 0 {
				t.Fatalf("want ErrRemote naming a rank, got %v", err)
			}
			t.Log(err)
		case <-time.After(10 * time.Second):
			t.Fatal("hang after peer death")
		}
	}
}

// TestIdleGroupCPU measures what an idle group costs: two ranks on shared
// memory, after a burst of small ops (so that every spinning path has
// run), must use at most 1 % of a core each while nobody issues anything.
func TestIdleGroupCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("measures for 2 s")
	}
	ctx := context.Background()
	bs := group(t, 2, &cpupool.Options{Transport: "shm"})
	each(t, bs, func(r int, b backend.Backend) error {
		x := tensor.New(tensor.Float32, 2)
		for range 100 {
			w, err := b.Allreduce(ctx, backend.Meta{Timeout: 10 * time.Second}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // let the polls run out
	// The process's CPU counts the runtime's housekeeping too: the
	// background scavenger returns the memory that the package's earlier
	// tests freed at ~1 % of a CPU (0.8 % of a core per rank read in a
	// whole-package run). Collect and return it all now, so that what is
	// measured is the idle group.
	debug.FreeOSMemory()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const span = 2 * time.Second
	c0, w0 := cpu(), time.Now()
	time.Sleep(span)
	used, wall := cpu()-c0, time.Since(w0)
	share := float64(used) / float64(wall) / 2 // per rank
	t.Logf("idle: %v of CPU in %v for 2 ranks: %.3f %% of a core per rank", used, wall.Round(time.Millisecond), 100*share)
	if share > 0.01 {
		t.Errorf("an idle rank uses %.2f %% of a core (want <= 1 %%)", 100*share)
	}
}

// TestLaneAllreduceChunked runs lane allreduces larger than a lane message
// (beyond twice coll.LaneChunk), which recursive doubling exchanges in chunks: worlds
// 2, 3 (the fold) and 4, with LaneBytes raised so that all take the lanes,
// element sizes 1 to 8 with odd counts (a last chunk of a few elements),
// and 4 float32 ops in a row (2.3 MiB), so that chunks wrap around the lanes.
func TestLaneAllreduceChunked(t *testing.T) {
	if 4*(coll.LaneChunk+64) > tcpmesh.LaneRingBytes || coll.LaneChunk > tcpmesh.LaneMax {
		t.Fatalf("four lane chunks of %d bytes do not fit in a lane of %d bytes", coll.LaneChunk, tcpmesh.LaneRingBytes)
	}
	ctx := context.Background()
	for _, n := range []int{2, 3, 4} {
		bs := group(t, n, &cpupool.Options{Transport: "shm", LaneBytes: 8 << 20})
		for _, c := range []struct {
			dt    tensor.DType
			elems int
		}{{tensor.Int8, 530001}, {tensor.Float16, 270001}, {tensor.Float32, 150001}, {tensor.Float64, 75001}, {tensor.Float32, 450001}} {
			for _, op := range []reduceop.ReduceOp{backend.SUM, backend.MAX} {
				if op.Type == reduceop.Max && c.dt != tensor.Float32 {
					continue // the kernels are the lanes' either way: time under -race
				}
				each(t, bs, func(r int, b backend.Backend) error {
					val := func(rank, i int) float64 { return float64((i+rank)%3 + 1) }
					for k := range 4 {
						vals := make([]float64, c.elems)
						for i := range vals {
							vals[i] = val(r+k, i)
						}
						got, err := allreduceValues(ctx, b, c.dt, op, vals)
						if err != nil {
							return err
						}
						for i, v := range got {
							if want := laneExpect(c.dt, op, n, func(rank int) float64 { return val(rank+k, i) }); v != want {
								return fmt.Errorf("world %d %v %v rank %d op %d: element %d = %v, want %v", n, c.dt, op, r, k, i, v, want)
							}
						}
						if c.dt != tensor.Float32 {
							break // one op of the other types; float32 goes round the lanes
						}
					}
					return nil
				})
			}
		}
	}
}

// TestLaneAllreduceRSAG runs lane allreduces beyond 128 KiB in worlds of
// 3 and 4, which take the reduce-scatter and allgather
// (coll.AllreduceLanesRSAG): every reduce op on integer and floating
// types of every width, odd counts (blocks of unequal length).
func TestLaneAllreduceRSAG(t *testing.T) {
	ctx := context.Background()
	ops := []reduceop.ReduceOp{backend.SUM, backend.PRODUCT, backend.MIN, backend.MAX, backend.AVG, backend.BAND, backend.BOR, backend.BXOR}
	for _, n := range []int{3, 4} {
		bs := group(t, n, &cpupool.Options{Transport: "shm"})
		for _, dt := range []tensor.DType{tensor.Int8, tensor.Int32, tensor.BFloat16, tensor.Float32, tensor.Float64} {
			elems := (128<<10)/dt.Size() + 4001
			for _, op := range ops {
				if op.ValidFor(dt) != nil {
					continue
				}
				each(t, bs, func(r int, b backend.Backend) error {
					return checkLaneValues(ctx, b, dt, op, n, r, elems, func(rank, i int) float64 { return float64((i+rank)%3 + 1) })
				})
			}
		}
	}
}

// TestLaneAllreduceRSAGRounds runs lane allreduces whose blocks exceed a
// lane message (coll.RSAGMax), which coll.AllreduceLanesRSAG takes in
// rounds, in worlds of 3 and 4 over the real shared-memory lanes: two
// whole rounds and a short third, odd counts.
func TestLaneAllreduceRSAGRounds(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{3, 4} {
		bs := group(t, n, &cpupool.Options{Transport: "shm", LaneBytes: 64 << 20})
		for _, dt := range []tensor.DType{tensor.Int8, tensor.Float64} {
			elems := 2*n*coll.RSAGMax/dt.Size() + 4001
			for _, op := range []reduceop.ReduceOp{backend.SUM, backend.MAX} {
				each(t, bs, func(r int, b backend.Backend) error {
					return checkLaneValues(ctx, b, dt, op, n, r, elems, func(rank, i int) float64 { return float64((i+rank)%3 + 1) })
				})
			}
		}
	}
}

// checkLaneValues is one rank's part (rank r of n) in an allreduce of op
// over elems values of dt, val(rank, i) on each rank: it fails unless every
// element is laneExpect's answer (for bool, its truth).
func checkLaneValues(ctx context.Context, b backend.Backend, dt tensor.DType, op reduceop.ReduceOp, n, r, elems int, val func(rank, i int) float64) error {
	vals := make([]float64, elems)
	for i := range vals {
		vals[i] = val(r, i)
	}
	got, err := allreduceValues(ctx, b, dt, op, vals)
	if err != nil {
		return err
	}
	for i, v := range got {
		want := laneExpect(dt, op, n, func(rank int) float64 { return val(rank, i) })
		if v != want && !(dt == tensor.Bool && (v != 0) == (want != 0)) {
			return fmt.Errorf("world %d %v %v rank %d: element %d = %v, want %v", n, dt, op, r, i, v, want)
		}
	}
	return nil
}

// TestLaneChunkedPeerDeath: a rank that dies while its peers wait in a
// lane allreduce that goes in chunks is named by them with ErrRemote,
// promptly.
func TestLaneChunkedPeerDeath(t *testing.T) {
	expectPeerDeathRemote(t, &cpupool.Options{Transport: "shm", LaneBytes: 8 << 20}, 1<<20)
}

// TestLaneStreamedPeerDeath: the same with the lane copies streamed past
// the cache (non-temporal stores into the ring).
func TestLaneStreamedPeerDeath(t *testing.T) {
	expectPeerDeathRemote(t, &cpupool.Options{Transport: "shm", LaneCopies: cpupool.CopiesStreamed}, 4<<20)
}

// TestLaneRSAGPeerDeath: a rank that dies while its peers wait in a lane
// reduce-scatter and allgather is named by them with ErrRemote, promptly.
func TestLaneRSAGPeerDeath(t *testing.T) {
	expectPeerDeathRemote(t, &cpupool.Options{Transport: "shm"}, 1<<16)
}

// TestDirectAllreduce runs allreduces larger than the lanes, which ranks
// that may read each other's memory (these, of one process) run by direct
// reads (coll.AllreduceDirect), and the same by default, which takes the
// lanes at every size at 2 ranks and when ranks outnumber cores: worlds
// 2, 3 and 4, element sizes 1, 2, 4
// and 8, an odd count (uneven blocks, pieces that end mid-block), SUM and
// MAX, small integers so that the exact answer is known; at 2 ranks also
// blocks of several of the pair's larger pieces (coll.DirectPiece) and a
// part of one.
func TestDirectAllreduce(t *testing.T) {
	ctx := context.Background()
	type shape struct {
		dt    tensor.DType
		elems int
	}
	var shapes []shape
	for _, dt := range []tensor.DType{tensor.Int8, tensor.Float16, tensor.Float32, tensor.Float64} {
		shapes = append(shapes, shape{dt, 300007})
	}
	for _, c := range []struct {
		n    int
		opts *cpupool.Options
	}{
		// 2 ranks, and more on fewer cores (as here in CI), take the
		// lanes at every size by default: LaneBytes sends these to the
		// direct reads; the default runs them over the lanes, in chunks.
		{2, &cpupool.Options{Transport: "shm", LaneBytes: 256 << 10}},
		{2, &cpupool.Options{Transport: "shm"}},
		{3, &cpupool.Options{Transport: "shm", LaneBytes: 256 << 10}},
		{3, &cpupool.Options{Transport: "shm"}},
		{4, &cpupool.Options{Transport: "shm", LaneBytes: 256 << 10}},
		{4, &cpupool.Options{Transport: "shm"}},
		// The copy modes fixed rather than chosen per size.
		{2, &cpupool.Options{Transport: "shm", LaneCopies: cpupool.CopiesStreamed}},
		{3, &cpupool.Options{Transport: "shm", LaneCopies: cpupool.CopiesCached}},
	} {
		n := c.n
		bs := group(t, n, c.opts)
		all := shapes
		if n == 2 {
			// Blocks of 2.9 and 5.7 MiB: pieces of 2 MiB, the last one short.
			all = append(all, shape{tensor.Float32, 1500007}, shape{tensor.Float64, 1500007})
		}
		for _, sh := range all {
			dt, elems := sh.dt, sh.elems
			for _, op := range []reduceop.ReduceOp{backend.SUM, backend.MAX} {
				each(t, bs, func(r int, b backend.Backend) error {
					vals := make([]float64, elems)
					for i := range vals {
						vals[i] = float64((i+r)%3 + 1)
					}
					got, err := allreduceValues(ctx, b, dt, op, vals)
					if err != nil {
						return err
					}
					for i, v := range got {
						if want := laneExpect(dt, op, n, func(rank int) float64 { return float64((i+rank)%3 + 1) }); v != want {
							return fmt.Errorf("world %d %v %v rank %d: element %d = %v, want %v", n, dt, op, r, i, v, want)
						}
					}
					return nil
				})
			}
		}
	}
}

// TestDirectPeerDeath: a rank that dies (here: aborts, closing its
// connections) while its peers wait in a direct allreduce is named by
// them with ErrRemote, promptly.
func TestDirectPeerDeath(t *testing.T) {
	// LaneBytes: 3 ranks on fewer cores would take the lanes.
	expectPeerDeathRemote(t, &cpupool.Options{Transport: "shm", LaneBytes: 256 << 10}, 1<<20)
}

// allreduceValues allreduces vals, as a tensor of dtype dt, with op on b
// and returns the result as float64s.
func allreduceValues(ctx context.Context, b backend.Backend, dt tensor.DType, op reduceop.ReduceOp, vals []float64) ([]float64, error) {
	x, err := tensor.FromFloat64s(dt, vals)
	if err != nil {
		return nil, err
	}
	w, err := b.Allreduce(ctx, backend.Meta{Timeout: 20 * time.Second}, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: op})
	if err != nil {
		return nil, err
	}
	if err := w.Wait(ctx); err != nil {
		return nil, err
	}
	return x.Float64s()
}

// rawLaneOpts makes every 2-rank allreduce beyond 256 KiB a direct one
// that sends its raw half over the lanes (Options.RawLaneBytes), so that
// small buffers run it.
var rawLaneOpts = &cpupool.Options{Transport: "shm", LaneBytes: 256 << 10, RawLaneBytes: 256<<10 + 1}

// TestDirectRawLanes runs direct allreduces of 2 ranks whose raw half
// goes over the lanes (coll.AllreduceDirectLanes): every reduce op on
// integer and floating types of every width, odd counts (blocks of
// unequal length, several raw chunks, gathers in groups and the rest),
// one op after another on the same lanes.
func TestDirectRawLanes(t *testing.T) {
	ctx := context.Background()
	ops := []reduceop.ReduceOp{backend.SUM, backend.PRODUCT, backend.MIN, backend.MAX, backend.AVG, backend.BAND, backend.BOR, backend.BXOR}
	bs := group(t, 2, rawLaneOpts)
	for _, dt := range []tensor.DType{tensor.Int8, tensor.Int32, tensor.BFloat16, tensor.Float32, tensor.Float64} {
		elems := (1<<20)/dt.Size() + 4001
		for _, op := range ops {
			if op.ValidFor(dt) != nil {
				continue
			}
			each(t, bs, func(r int, b backend.Backend) error {
				return checkLaneValues(ctx, b, dt, op, 2, r, elems, func(rank, i int) float64 { return float64((i+rank)%3 + 1) })
			})
		}
	}
}

// TestDirectRawLanesPeerDeath: a rank whose peer dies while it waits in
// a direct allreduce with the raw half over the lanes names the peer
// with ErrRemote, promptly.
func TestDirectRawLanesPeerDeath(t *testing.T) {
	ctx := context.Background()
	bs := group(t, 2, rawLaneOpts)
	x := tensor.New(tensor.Float32, 1<<20)
	w, err := bs[0].Allreduce(ctx, backend.Meta{Timeout: time.Minute}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = bs[1].Abort(ctx, errors.New("simulated crash"))
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx) }()
	select {
	case err := <-done:
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrRemote) || !errors.As(err, &oe) || len(oe.Ranks) != 1 || oe.Ranks[0] != 1 {
			t.Fatalf("want ErrRemote naming rank 1, got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hang after peer death")
	}
}

// TestDeferredLaneOps: small lane allreduces issued with nothing else in
// flight wait in the Backend's ring and run on their Wait (the counter
// shows it), whichever algorithm laneAlgo picks (the board at 4 ranks with
// flat lanes, recursive doubling at 2 and 3 ranks, the largest size the
// ring takes); one that nobody waits for is run by a worker after the
// nudge (polled with IsCompleted only); a window of five in flight runs
// from the ring, the Wait of a later one running the earlier ones, also
// with Waits on two goroutines at once; ops issued back to back before
// any Wait, and a broadcast issued behind them, run in issue order with
// the right sums.
func TestDeferredLaneOps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		flat  bool
		elems int
	}{
		{"board/4 ranks", 4, true, 1},
		{"recursive doubling/2 ranks", 2, false, 1},
		{"recursive doubling/3 ranks", 3, false, 1},
		{"recursive doubling/2 ranks/4 KiB", 2, false, 1024},
	} {
		t.Run(tc.name, func(t *testing.T) { testDeferredLaneOps(t, tc.n, tc.flat, tc.elems) })
	}
}

func testDeferredLaneOps(t *testing.T, n int, flat bool, elems int) {
	ctx := context.Background()
	bs := group(t, n, &cpupool.Options{Transport: "shm"})
	for _, b := range bs {
		cpupool.SetFlatLanes(b, flat)
		if flat && !cpupool.HasBoard(b) {
			t.Fatal("flat lanes without a board: the case would not run the algorithm it names")
		}
	}
	meta := backend.Meta{Timeout: 15 * time.Second}
	sum := float64(n * (n - 1) / 2)
	fill := func(v float32) *tensor.Tensor {
		xs := make([]float32, elems)
		for i := range xs {
			xs[i] = v + float32(i)
		}
		x, _ := tensor.FromSlice(xs)
		return x
	}
	check := func(x *tensor.Tensor, want float64) error {
		for i := range elems {
			if got, w := x.At(i), want+float64(n*i); got != w {
				return fmt.Errorf("element %d: %v, want %v", i, got, w)
			}
		}
		return nil
	}
	// Issued and waited at once: the ring's path. A worker that wakes
	// between the issue and the Wait takes the op to the queue, so the
	// count is asked of 20 ops, not of each.
	each(t, bs, func(r int, b backend.Backend) error {
		before := cpupool.DeferredRuns(b)
		for range 20 {
			x := fill(float32(r))
			w, err := b.Allreduce(ctx, meta, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if err := check(x, sum); err != nil {
				return err
			}
		}
		if cpupool.DeferredRuns(b) == before {
			return fmt.Errorf("rank %d: no op ran from the ring", r)
		}
		return nil
	})
	// Nobody waits: only IsCompleted is asked.
	each(t, bs, func(r int, b backend.Backend) error {
		x := fill(float32(r))
		w, err := b.Allreduce(ctx, meta, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(10 * time.Second); !w.IsCompleted(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("rank %d: an op nobody waits for did not complete in 10 s", r)
			}
		}
		if err := w.Exception(); err != nil {
			return err
		}
		return check(x, sum)
	})
	// A window of ops in flight, as a pipelined loop keeps them: the Wait
	// of the third runs the first three from the ring, in issue order.
	// Then the same with Waits on two goroutines at once (two takers,
	// whose batches run in their turns).
	each(t, bs, func(r int, b backend.Backend) error {
		batched := false
		for it := range 20 {
			xs := make([]*tensor.Tensor, 5)
			ws := make([]backend.Work, 5)
			for k := range xs {
				xs[k] = fill(float32(r + k))
				var err error
				if ws[k], err = b.Allreduce(ctx, meta, xs[k:k+1], backend.AllreduceOptions{}); err != nil {
					return err
				}
			}
			before := cpupool.DeferredRuns(b)
			if it%2 == 0 {
				if err := ws[2].Wait(ctx); err != nil {
					return err
				}
				batched = batched || cpupool.DeferredRuns(b)-before >= 3
				for _, k := range []int{4, 0, 3, 1} {
					if err := ws[k].Wait(ctx); err != nil {
						return err
					}
				}
			} else {
				errs := make(chan error, 2)
				for _, k := range []int{1, 4} {
					go func() { errs <- ws[k].Wait(ctx) }()
				}
				for range 2 {
					if err := <-errs; err != nil {
						return err
					}
				}
				for _, w := range ws {
					if err := w.Wait(ctx); err != nil {
						return err
					}
				}
			}
			for k, x := range xs {
				if err := check(x, sum+float64(n*k)); err != nil {
					return fmt.Errorf("rank %d window op %d: %w", r, k, err)
				}
			}
		}
		if !batched {
			return fmt.Errorf("rank %d: no Wait ran three ops from the ring in 10 windows", r)
		}
		return nil
	})
	// Back to back, then a broadcast behind the last one.
	root := n - 1
	each(t, bs, func(r int, b backend.Backend) error {
		xs := make([]*tensor.Tensor, 5)
		ws := make([]backend.Work, 0, 6)
		for k := range xs {
			xs[k] = fill(float32(r + k))
			w, err := b.Allreduce(ctx, meta, xs[k:k+1], backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			ws = append(ws, w)
		}
		y, _ := tensor.FromSlice([]float32{float32(r + 100)})
		w, err := b.Broadcast(ctx, meta, []*tensor.Tensor{y}, backend.BroadcastOptions{RootRank: root})
		if err != nil {
			return err
		}
		ws = append(ws, w)
		for i := len(ws) - 1; i >= 0; i-- {
			if err := ws[i].Wait(ctx); err != nil {
				return err
			}
		}
		for k, x := range xs {
			if err := check(x, sum+float64(n*k)); err != nil {
				return fmt.Errorf("rank %d op %d: %w", r, k, err)
			}
		}
		if got, want := y.At(0), float64(root+100); got != want {
			return fmt.Errorf("rank %d: broadcast %v, want %v", r, got, want)
		}
		return nil
	})
}

// TestDeferredAbort: an op waiting in the deferred ring when its rank
// aborts fails with ErrAborted, and a later op is refused.
func TestDeferredAbort(t *testing.T) {
	ctx := context.Background()
	bs := group(t, 4, &cpupool.Options{Transport: "shm"})
	for _, b := range bs {
		cpupool.SetFlatLanes(b, true)
	}
	x := tensor.New(tensor.Float32, 2)
	w, err := bs[0].Allreduce(ctx, backend.Meta{Timeout: time.Minute}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = bs[0].Abort(ctx, errors.New("test abort"))
	if err := w.Wait(ctx); !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("want ErrAborted, got %v", err)
	}
	if _, err := bs[0].Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("after abort: %v", err)
	}
}
