package cpupool_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// pgGroup starts world ranks of the dispatcher over cpupool in this
// process, the flight recorder on (the default).
func pgGroup(t *testing.T, world int) []*dispatcher.ProcessGroup {
	st := store.NewHashStore()
	return testgroup.StartClosed(t, world, func(r int) (*dispatcher.ProcessGroup, error) {
		return dispatcher.Init(context.Background(), dispatcher.Config{Backend: "cpupool", Store: st, Rank: r, WorldSize: world, Timeout: 20 * time.Second})
	})
}

// eachPG runs f on every rank at once, as each does for backends.
func eachPG(t *testing.T, pgs []*dispatcher.ProcessGroup, f func(r int, pg *dispatcher.ProcessGroup) error) {
	t.Helper()
	bs := make([]backend.Backend, len(pgs))
	for r, pg := range pgs {
		b, err := pg.Backend(tensor.CPU)
		if err != nil {
			t.Fatal(err)
		}
		bs[r] = b
	}
	each(t, bs, func(r int, _ backend.Backend) error { return f(r, pgs[r]) })
}

// TestWaitFormReusesWorks: the dispatcher's blocking AllreduceWait gives
// small ops' Works back to cpupool, which reuses them: a loop of them
// allocates (next to) nothing, and every op still gets its own result.
// Async ops, barriers (which wait on lists of earlier Works) and kept
// Works run in between, so that a reused Work that something still held
// would show, with -race, as a race or a wrong answer.
func TestWaitFormReusesWorks(t *testing.T) {
	ctx := context.Background()
	const world = 2
	pgs := pgGroup(t, world)
	eachPG(t, pgs, func(r int, pg *dispatcher.ProcessGroup) error {
		x := tensor.New(tensor.Float32, 3)
		var kept []backend.Work
		var keptX []*tensor.Tensor
		for k := range 3000 {
			x.Fill(float64(r + k))
			if err := pg.AllreduceWait(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
				return err
			}
			if want := float64(world*k + world*(world-1)/2); x.At(2) != want {
				return fmt.Errorf("rank %d op %d: %v, want %v", r, k, x.At(2), want)
			}
			switch k % 100 {
			case 17: // an async op, kept to the end
				y := tensor.New(tensor.Float32, 1)
				y.Fill(float64(k))
				w, err := pg.Allreduce(ctx, []*tensor.Tensor{y}, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				kept, keptX = append(kept, w), append(keptX, y)
			case 53:
				if err := pg.BarrierWait(ctx, backend.BarrierOptions{}); err != nil {
					return err
				}
			}
		}
		for i, w := range kept {
			if err := w.Wait(ctx); err != nil {
				return err
			}
			k := 100*i + 17
			if keptX[i].At(0) != float64(world*k) || w.SeqNum() == 0 || !w.IsCompleted() {
				return fmt.Errorf("rank %d kept op %d: %v, want %v (seq %d)", r, k, keptX[i].At(0), world*k, w.SeqNum())
			}
		}
		return nil
	})

	// Bytes allocated per op, both ranks: a Work is 168 B (a share of a
	// 4 KiB slab's) when it is not reused.
	run := func(n int) {
		eachPG(t, pgs, func(r int, pg *dispatcher.ProcessGroup) error {
			x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
			for range n {
				if err := pg.AllreduceWait(ctx, x, backend.AllreduceOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	run(500)
	var before, after runtime.MemStats
	const n = 4000
	runtime.ReadMemStats(&before)
	run(n)
	runtime.ReadMemStats(&after)
	per := float64(after.TotalAlloc-before.TotalAlloc) / n
	t.Logf("%.1f bytes allocated per op on two ranks", per)
	if per >= 64 {
		t.Fatalf("%.1f bytes allocated per op on two ranks: the Works are not reused (168 B each otherwise)", per)
	}
}

// TestWaitFormSetsNoTimer: a blocking op (Meta.Waited), deferred or
// queued, is run by its own Wait, so it sets no nudge timer, whose wake-ups took a core from
// the ranks of an oversubscribed host; an async one, which nobody may
// wait for, still sets it, so that a worker runs the op.
func TestWaitFormSetsNoTimer(t *testing.T) {
	ctx := context.Background()
	pgs := pgGroup(t, 2)
	bs := make([]backend.Backend, len(pgs))
	for r, pg := range pgs {
		bs[r], _ = pg.Backend(tensor.CPU)
	}
	// Past the nudge's longest period, so that a timer set before fired.
	time.Sleep(20 * time.Millisecond)
	eachPG(t, pgs, func(r int, pg *dispatcher.ProcessGroup) error {
		x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
		big := []*tensor.Tensor{tensor.New(tensor.Float32, 16<<10)} // 64 KiB: queued, not deferred
		for k := range 200 {
			ts := x
			if k%4 == 3 {
				ts = big
			}
			if err := pg.AllreduceWait(ctx, ts, backend.AllreduceOptions{}); err != nil {
				return err
			}
			if cpupool.NudgeArmed(bs[r]) {
				return fmt.Errorf("rank %d: a blocking op of %d B set the nudge timer", r, ts[0].Numel()*4)
			}
		}
		w, err := pg.Allreduce(ctx, x, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		// Idle before it, the op waits in the ring; the timer's shortest
		// period (200 µs) is far longer than this look takes.
		armed := cpupool.NudgeArmed(bs[r])
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if !armed {
			return fmt.Errorf("rank %d: an async op left in the ring set no nudge timer", r)
		}
		return nil
	})
}
