package ucc

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// TestWaitFormReusesHandles: the dispatcher's blocking AllreduceWait, with
// its flight recorder on (the default), gives small ops' handles back to
// ucc (Outcome lets the recorder and the metrics let go of them, Release
// takes them back), so a loop of them allocates nothing per op; async ops
// kept to the end, and barriers behind async ops (which hold the earlier
// ops' handles), keep their own handles and results.
func TestWaitFormReusesHandles(t *testing.T) {
	inRankProcesses(t, "TestWaitFormReusesHandles", "GOCOLL_UCC_TEST_RELEASE_RANK", releaseRank)
}

func releaseRank(t *testing.T, rank int, path string) {
	const world = 2
	st, err := store.NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	pg, err := dispatcher.Init(ctx, dispatcher.Config{Backend: Name, Store: st, Rank: rank, WorldSize: world, Timeout: time.Minute,
		BackendOptions: map[string]any{Name: &Options{Fingerprints: FingerprintsShm}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Close(cctx)
	})
	x := tensor.New(tensor.Float32, 3)
	xs := []*tensor.Tensor{x}
	var kept []backend.Work
	var keptX []*tensor.Tensor
	for k := range 3000 {
		x.Fill(float64(rank + k))
		if err := pg.AllreduceWait(ctx, xs, backend.AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
		if want := float64(world*k + world*(world-1)/2); x.At(2) != want {
			t.Fatalf("rank %d op %d: %v, want %v", rank, k, x.At(2), want)
		}
		switch k % 100 {
		case 17: // an async op, kept to the end
			y := tensor.New(tensor.Float32, 1)
			y.Fill(float64(k))
			w, err := pg.Allreduce(ctx, []*tensor.Tensor{y}, backend.AllreduceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			kept, keptX = append(kept, w), append(keptX, y)
		case 53: // a barrier behind an async op: it holds that op's handle
			w, err := pg.Allreduce(ctx, []*tensor.Tensor{tensor.New(tensor.Float32, 1)}, backend.AllreduceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := pg.BarrierWait(ctx, backend.BarrierOptions{}); err != nil {
				t.Fatal(err)
			}
			if !w.IsCompleted() {
				t.Fatalf("rank %d op %d: the barrier returned before the op issued ahead of it completed", rank, k)
			}
		}
	}
	for i, w := range kept {
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		k := 100*i + 17
		if at, _, _, err := w.(*handle).Outcome(); keptX[i].At(0) != float64(world*k) || !w.IsCompleted() || at == 0 || err != nil {
			t.Fatalf("rank %d kept op %d: %v (completed %v at %v, %v), want %v", rank, k, keptX[i].At(0), w.IsCompleted(), at, err, world*k)
		}
	}

	// Bytes allocated per op: a handle is 65 B (a 4 KiB chunk's share)
	// when it is not reused, and an op with a timeout not the group's
	// adds its extra's. Not under the race detector, whose sync.Pool
	// drops a share of what is put back on purpose.
	if raceOn {
		return
	}
	for _, timeout := range []time.Duration{0, 90 * time.Second} {
		run := func(n int) {
			for range n {
				if err := pg.AllreduceWait(ctx, xs, backend.AllreduceOptions{Timeout: timeout}); err != nil {
					t.Fatal(err)
				}
			}
		}
		run(500)
		var before, after runtime.MemStats
		const n = 4000
		runtime.ReadMemStats(&before)
		run(n)
		runtime.ReadMemStats(&after)
		if per := float64(after.TotalAlloc-before.TotalAlloc) / n; per >= 32 {
			t.Fatalf("rank %d, op timeout %v: %.1f bytes allocated per op: the handles are not reused (65 B each otherwise, and the extra of an own timeout)", rank, timeout, per)
		}
	}
}
