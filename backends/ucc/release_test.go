package ucc

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// TestReleaseReusesHandles: a blocking loop (Meta.Waited, Wait, then
// Release, as the dispatcher's blocking forms do) takes its handles back
// from the ones it released, so it allocates nothing per op; async ops
// kept to the end, and barriers that hold earlier ops' handles in between,
// keep their own handles intact.
func TestReleaseReusesHandles(t *testing.T) {
	if !inRankProcesses(t, "TestReleaseReusesHandles", "GOCOLL_UCC_TEST_RELEASE_RANK", releaseRank) {
		return
	}
}

func releaseRank(t *testing.T, rank int, path string) {
	_, b := rankBackend(t, rank, path, "release", time.Minute)
	ctx := context.Background()
	const world = 2
	seq := uint64(0)
	meta := func(op backend.Op, waited bool) backend.Meta {
		seq++
		return backend.Meta{Op: op, Seq: seq, Waited: waited}
	}
	// blocking is one op of a blocking form: issue, Wait, Release.
	blocking := func(x *tensor.Tensor) error {
		w, err := b.Allreduce(ctx, meta(backend.OpAllreduce, true), []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		w.(backend.Releaser).Release()
		return nil
	}
	x := tensor.New(tensor.Float32, 3)
	var kept []backend.Work
	var keptX []*tensor.Tensor
	var keptSeq []uint64
	for k := range 3000 {
		x.Fill(float64(rank + k))
		if err := blocking(x); err != nil {
			t.Fatal(err)
		}
		if want := float64(world*k + world*(world-1)/2); x.At(2) != want {
			t.Fatalf("rank %d op %d: %v, want %v", rank, k, x.At(2), want)
		}
		switch k % 100 {
		case 17: // an async op, kept to the end
			y := tensor.New(tensor.Float32, 1)
			y.Fill(float64(k))
			w, err := b.Allreduce(ctx, meta(backend.OpAllreduce, false), []*tensor.Tensor{y}, backend.AllreduceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			kept, keptX, keptSeq = append(kept, w), append(keptX, y), append(keptSeq, seq)
		case 53: // a barrier behind an async op: it holds that op's handle
			y := tensor.New(tensor.Float32, 1)
			w, err := b.Allreduce(ctx, meta(backend.OpAllreduce, false), []*tensor.Tensor{y}, backend.AllreduceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			bw, err := b.Barrier(ctx, meta(backend.OpBarrier, true), backend.BarrierOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := bw.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !w.IsCompleted() {
				t.Fatalf("rank %d op %d: the barrier completed before the op issued ahead of it", rank, k)
			}
			bw.(backend.Releaser).Release()
		}
	}
	for i, w := range kept {
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		k := 100*i + 17
		if keptX[i].At(0) != float64(world*k) || w.SeqNum() != keptSeq[i] || !w.IsCompleted() {
			t.Fatalf("rank %d kept op %d: %v (seq %d), want %v (seq %d)", rank, k, keptX[i].At(0), w.SeqNum(), world*k, keptSeq[i])
		}
	}

	// Bytes allocated per op: a handle is 128 B (a 4 KiB chunk's share)
	// when it is not reused. Not under the race detector, whose
	// sync.Pool drops a share of what is put back on purpose.
	if raceOn {
		return
	}
	run := func(n int) {
		for range n {
			if err := blocking(x); err != nil {
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
	per := float64(after.TotalAlloc-before.TotalAlloc) / n
	t.Logf("rank %d: %.1f bytes allocated per op", rank, per)
	if per >= 64 {
		t.Fatalf("rank %d: %.1f bytes allocated per op: the handles are not reused (128 B each otherwise)", rank, per)
	}
}
