package cpupool_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/tensor"
)

// TestWorkOutlivesItsJob: a lane allreduce's job goes back to the pool
// once the op is done, and its Work must not notice. Every rank issues
// ops one after another, keeps every Work and tensor, waits for some
// from a second goroutine at once, and aborts some after completion;
// at the end every Work still answers for its own op (sequence number,
// no error, duration, its own tensors as the future's value, a wait
// that returns at once), and every tensor holds its op's sum. Run it
// with -race: the reuse races the Work's methods. Then ops that nobody
// waits for at once, which workers run while the caller issues more (the
// caller must not touch a queued job). It also checks that jobs are
// reused: the bytes allocated per op stay below a job's size.
func TestWorkOutlivesItsJob(t *testing.T) {
	ctx := context.Background()
	const n, ops = 2, 600
	// Timed, so that every Work reports its Duration (TestUntimedWork:
	// the default).
	bs := group(t, n, &cpupool.Options{Transport: "shm", EnableTiming: true})
	type kept struct {
		w backend.Work
		x *tensor.Tensor
	}
	each(t, bs, func(r int, b backend.Backend) error {
		keep := make([]kept, ops)
		var wg sync.WaitGroup
		errs := make(chan error, ops)
		for k := range ops {
			x := tensor.New(tensor.Float32, 3)
			x.Fill(float64(r + k))
			w, err := b.Allreduce(ctx, backend.Meta{Seq: uint64(k + 1), Timeout: 20 * time.Second}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			keep[k] = kept{w, x}
			if k%7 == 0 {
				wg.Go(func() { errs <- w.Wait(ctx) })
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if k%5 == 0 {
				w.Abort(errors.New("too late")) // completed: no effect
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		for k, c := range keep {
			w := c.w
			if !w.IsCompleted() || w.SeqNum() != uint64(k+1) || w.Exception() != nil || w.Wait(ctx) != nil || w.WaitHost(ctx) != nil {
				return fmt.Errorf("rank %d op %d: completed %v seq %d exception %v", r, k, w.IsCompleted(), w.SeqNum(), w.Exception())
			}
			if _, err := w.Duration(); err != nil {
				return fmt.Errorf("rank %d op %d: duration: %w", r, k, err)
			}
			if v, err := w.Future().Value(); err != nil || len(v) != 1 || v[0] != c.x {
				return fmt.Errorf("rank %d op %d: future %v, %v: not the op's tensor", r, k, v, err)
			}
			if want := float64(n*k + n*(n-1)/2); c.x.At(2) != want {
				return fmt.Errorf("rank %d op %d: %v, want %v", r, k, c.x.At(2), want)
			}
		}
		return nil
	})

	// Ops that nobody waits for at once: the nudge wakes a worker, which
	// runs them (and returns their jobs to the pool) while the caller
	// issues the next ones; the caller must not touch a job once it is
	// queued.
	each(t, bs, func(r int, b backend.Backend) error {
		var ws []backend.Work
		var xs []*tensor.Tensor
		for k := range 20 {
			x := tensor.New(tensor.Float32, 2)
			x.Fill(float64(r + k))
			w, err := b.Allreduce(ctx, backend.Meta{Seq: uint64(ops + 1 + k), Timeout: 20 * time.Second}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			ws, xs = append(ws, w), append(xs, x)
			time.Sleep(3 * time.Millisecond) // past the nudge's longest period
		}
		for k, w := range ws {
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if want := float64(n*k + n*(n-1)/2); xs[k].At(1) != want || w.SeqNum() != uint64(ops+1+k) {
				return fmt.Errorf("rank %d unwaited op %d: %v, want %v (seq %d)", r, k, xs[k].At(1), want, w.SeqNum())
			}
		}
		return nil
	})

	// Bytes allocated per op, both ranks: a job is 480 bytes (a size
	// class of 512), the Work 176; with every job allocated anew the
	// pair would take at least 1024.
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 2), tensor.New(tensor.Float32, 2)}
	run := func(k int) {
		each(t, bs, func(r int, b backend.Backend) error {
			for i := range k {
				w, err := b.Allreduce(ctx, backend.Meta{Seq: uint64(ops + 21 + i), Timeout: 20 * time.Second}, x[r:r+1], backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	run(200) // warm: the pool holds jobs
	var before, after runtime.MemStats
	const k = 2000
	runtime.ReadMemStats(&before)
	run(k)
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / k; per >= 1024 {
		t.Fatalf("%d bytes allocated per op on two ranks: jobs are not reused", per)
	} else {
		t.Logf("%d bytes allocated per op on two ranks", per)
	}
}

// TestUntimedWork: by default a Work is not timed (Duration says so with
// backend.ErrNoTiming, as nccl's and PyTorch's without ENABLE_TIMING),
// yet it reports that it started; with EnableTiming its Duration is the
// op's. Both the deferred small op, which its Wait runs, and a queued
// larger one.
func TestUntimedWork(t *testing.T) {
	ctx := context.Background()
	for _, timed := range []bool{false, true} {
		bs := group(t, 2, &cpupool.Options{Transport: "shm", EnableTiming: timed})
		each(t, bs, func(r int, b backend.Backend) error {
			for k, n := range []int{2, 1 << 16} {
				x := tensor.New(tensor.Float32, n)
				w, err := b.Allreduce(ctx, backend.Meta{Seq: uint64(k + 1), Timeout: 20 * time.Second, Waited: k == 0}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
				if ok, err := w.IsStarted(); !ok || err != nil {
					return fmt.Errorf("timing %v, %d floats: IsStarted %v, %v after Wait", timed, n, ok, err)
				}
				d, err := w.Duration()
				switch {
				case !timed && !errors.Is(err, backend.ErrNoTiming):
					return fmt.Errorf("untimed, %d floats: Duration %v, %v; want ErrNoTiming", n, d, err)
				case timed && (err != nil || d < 0):
					return fmt.Errorf("timed, %d floats: Duration %v, %v", n, d, err)
				}
			}
			return nil
		})
	}
}
