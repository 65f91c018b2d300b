package nccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl/internal/ncclhook"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

const n = 1024

func ones(e *rankEnv) (*tensor.Tensor, error) {
	return e.fill(tensor.Float32, n, func(i int) float64 { return float64(e.r + 1) })
}

func sumRanks(world int) float64 { return float64(world * (world + 1) / 2) }

// Async: the op returns while the current stream is held by a gate, so the
// collective cannot have started; IsCompleted stays false until the gate
// opens, then turns true.
func TestAsyncReturnsWhileCurrentStreamGated(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		e.cur.Synchronize()
		g, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer g.Free()
		defer g.Open()
		g.Hold(e.cur)
		t0 := time.Now()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if d := time.Since(t0); d > 200*time.Millisecond {
			return fmt.Errorf("async allreduce took %v to return", d)
		}
		time.Sleep(50 * time.Millisecond)
		if w.IsCompleted() {
			return errors.New("IsCompleted true while the current stream is gated")
		}
		g.Open()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.WaitHost(wctx); err != nil {
			return err
		}
		if !w.IsCompleted() {
			return errors.New("IsCompleted false after WaitHost")
		}
		if err := w.Wait(e.ctx); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return sumRanks(e.n) })
	})
}

// Wait returns at once, with the host not blocked, while the NCCL stream
// is held; a copy queued on the current stream after Wait sees the reduced
// value. Waiting under another stream protects only that stream.
func TestWaitOrdersOnlyTheWaitingStream(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		other, err := e.dev.NewStream(cuda.StreamOptions{})
		if err != nil {
			return err
		}
		defer other.Destroy()
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		ns, _ := e.b.Stream(e.ctx, e.r)
		pinA, _ := e.dev.HostAlloc(4*n, 0)
		pinB, _ := e.dev.HostAlloc(4*n, 0)
		defer pinA.Free()
		defer pinB.Free()
		evA, _ := e.dev.NewEvent(false)
		evB, _ := e.dev.NewEvent(false)
		defer evA.Destroy()
		defer evB.Destroy()
		e.cur.Synchronize()
		g, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer g.Free()
		defer g.Open()
		g.Hold(ns) // the NCCL stream is busy until we say so

		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		// Wait under the other stream B, not the producer's stream A.
		ctxB := cuda.WithStream(context.Background(), other)
		t0 := time.Now()
		if err := w.Wait(ctxB); err != nil {
			return err
		}
		if d := time.Since(t0); d > 100*time.Millisecond {
			return fmt.Errorf("Wait blocked the host for %v", d)
		}
		// B is ordered after the op: its copy must not run yet.
		cuda.CopyToPinned(ctxB, pinB, x)
		evB.Record(other)
		// A (e.cur) is not: its copy runs now and sees the unreduced input.
		cuda.CopyToPinned(e.ctx, pinA, x)
		evA.Record(e.cur)
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := evA.Wait(wctx); err != nil {
			return fmt.Errorf("stream A was held by a wait issued on B: %w", err)
		}
		if v := pinnedF32(pinA, 0); v != float64(e.r+1) {
			return fmt.Errorf("A saw %v before the op ran, want the input %d", v, e.r+1)
		}
		time.Sleep(20 * time.Millisecond)
		if done, _ := evB.Query(); done {
			return errors.New("B's copy ran although B waited on the gated op")
		}
		if w.IsCompleted() {
			return errors.New("op completed while the NCCL stream is gated")
		}
		g.Open()
		if err := evB.Wait(wctx); err != nil {
			return err
		}
		if v := pinnedF32(pinB, n-1); v != sumRanks(e.n) {
			return fmt.Errorf("B saw %v after Wait, want the reduced %v", v, sumRanks(e.n))
		}
		// And the plain case: Wait on the current stream, then copy.
		w2, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if err := w2.Wait(e.ctx); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return sumRanks(e.n) * float64(e.n) })
	})
}

// Sync mode: the kernel is on the current stream, so the op cannot complete
// while that stream is gated; the host is not blocked.
func TestSyncModeRunsOnCurrentStream(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		e.cur.Synchronize()
		g, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer g.Free()
		defer g.Open()
		g.Hold(e.cur)
		t0 := time.Now()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		if err := w.Wait(e.ctx); err != nil { // a no-op in sync mode
			return err
		}
		if d := time.Since(t0); d > 200*time.Millisecond {
			return fmt.Errorf("sync allreduce blocked the host for %v", d)
		}
		if w.(*Work).Stream().Handle() != e.cur.Handle() {
			return errors.New("sync-mode kernel not on the current stream")
		}
		time.Sleep(30 * time.Millisecond)
		if w.IsCompleted() {
			return errors.New("sync op completed while its stream is gated")
		}
		g.Open()
		return e.expect(x, func(int) float64 { return sumRanks(e.n) })
	})
}

// lifetime: free the input right after an async op, then allocate and fill
// a new buffer of the same size on the current stream. With the stash the
// result is correct; without it (the test-only knob ncclhook.Knobs.DisableStash)
// it is corrupted.
func TestLifetimeStash(t *testing.T) {
	for _, stash := range []bool{true, false} {
		t.Run(fmt.Sprintf("stash=%v", stash), func(t *testing.T) {
			envs := newRanksKnobs(t, 0, testOpts(), ncclhook.Knobs{DisableStash: !stash})
			each(t, envs, func(e *rankEnv) error {
				in, err := ones(e)
				if err != nil {
					return err
				}
				out, err := cuda.Empty(e.ctx, e.r, tensor.Float32, n*e.n)
				if err != nil {
					return err
				}
				defer out.Free()
				ns, _ := e.b.Stream(e.ctx, e.r)
				ev, _ := e.dev.NewEvent(false)
				defer ev.Destroy()
				e.cur.Synchronize()
				g, err := e.dev.NewGate()
				if err != nil {
					return err
				}
				defer g.Free()
				defer g.Open()
				g.Hold(ns)
				oldPtr := in.Ptr()
				w, err := e.b.AllgatherIntoTensor(e.ctx, e.meta(backend.OpAllgatherIntoTensor), out, in, backend.AllgatherIntoTensorOptions{Async: true})
				if err != nil {
					return err
				}
				in.Free() // the user drops the input before Wait
				y, err := cuda.Empty(e.ctx, e.r, tensor.Float32, n)
				if err != nil {
					return err
				}
				defer y.Free()
				reused := y.Ptr() == oldPtr
				e.cur.Memset32(y.Ptr(), 0x40e00000, n) // 7.0f
				// Let the memset run before the collective can.
				ev.Record(e.cur)
				wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := ev.Wait(wctx); err != nil {
					return err
				}
				g.Open()
				if err := w.Wait(e.ctx); err != nil {
					return err
				}
				got, err := e.read(out)
				if err != nil {
					return err
				}
				bad := expect(got, func(i int) float64 { return float64(i/n + 1) })
				if stash {
					if reused {
						return errors.New("the allocator reused a stashed input")
					}
					return bad
				}
				if !reused {
					t.Logf("rank %d: allocator did not reuse the freed input; corruption not provoked", e.r)
					return nil
				}
				if bad == nil {
					return errors.New("no corruption without the stash, though the freed input was reused")
				}
				t.Logf("rank %d without stash: %v (the hazard the stash prevents)", e.r, bad)
				return nil
			})
		})
	}
}

// Rule 4: an input produced on a side stream is safe only once the current
// stream waits on it.
func TestSideStreamInput(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		side, err := e.dev.NewStream(cuda.StreamOptions{})
		if err != nil {
			return err
		}
		defer side.Destroy()
		link, _ := e.dev.NewEvent(false)
		defer link.Destroy()
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		out, err := cuda.Empty(e.ctx, e.r, tensor.Float32, n*e.n)
		if err != nil {
			return err
		}
		defer out.Free()
		e.cur.Synchronize()
		g1, _ := e.dev.NewGate()
		g2, _ := e.dev.NewGate()
		defer g1.Free()
		defer g2.Free()
		defer g1.Open()
		defer g2.Open()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		// Unsafe: the side stream's write (x = 5) is pending; the current
		// stream does not wait on it, so the op reads the old value.
		g1.Hold(side)
		side.Memset32(x.Ptr(), 0x40a00000, n) // 5.0f
		w, err := e.b.AllgatherIntoTensor(e.ctx, e.meta(backend.OpAllgatherIntoTensor), out, x, backend.AllgatherIntoTensorOptions{Async: true})
		if err != nil {
			return err
		}
		if err := w.WaitHost(wctx); err != nil {
			return fmt.Errorf("op did not run ahead of the side stream: %w", err)
		}
		w.Wait(e.ctx)
		got, err := e.read(out)
		if err != nil {
			return err
		}
		if err := expect(got, func(i int) float64 { return float64(i/n + 1) }); err != nil {
			return fmt.Errorf("unsafe case: %w", err)
		}
		g1.Open()
		side.Synchronize()

		// Safe: the current stream waits on the side stream first.
		g2.Hold(side)
		side.Memset32(x.Ptr(), 0x40c00000, n) // 6.0f
		if err := e.cur.WaitStream(side, link); err != nil {
			return err
		}
		w, err = e.b.AllgatherIntoTensor(e.ctx, e.meta(backend.OpAllgatherIntoTensor), out, x, backend.AllgatherIntoTensorOptions{Async: true})
		if err != nil {
			return err
		}
		time.Sleep(30 * time.Millisecond)
		if w.IsCompleted() {
			return errors.New("op ran before the side stream produced its input")
		}
		g2.Open()
		if err := w.Wait(e.ctx); err != nil {
			return err
		}
		got, err = e.read(out)
		if err != nil {
			return err
		}
		return expect(got, func(int) float64 { return 6 })
	})
}

// Barrier: its Wait blocks the host until every rank has reached it and
// the work issued before it has completed.
func TestBarrier(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		ns, _ := e.b.Stream(e.ctx, e.r)
		e.cur.Synchronize()
		g, _ := e.dev.NewGate()
		defer g.Free()
		defer g.Open()
		g.Hold(ns)
		w1, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		bw, err := e.b.Barrier(e.ctx, e.meta(backend.OpBarrier), backend.BarrierOptions{})
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- bw.Wait(e.ctx) }()
		select {
		case err := <-done:
			return fmt.Errorf("barrier returned (%v) while earlier work is held", err)
		case <-time.After(50 * time.Millisecond):
		}
		g.Open()
		select {
		case err := <-done:
			if err != nil {
				return err
			}
		case <-time.After(20 * time.Second):
			return errors.New("barrier never returned")
		}
		if !w1.IsCompleted() || !bw.IsCompleted() {
			return errors.New("barrier returned before the earlier op completed")
		}
		return w1.Wait(e.ctx)
	})
}

// A coalesced block gives one Work (one group, one end event).
func TestCoalescedBlockOneWork(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		var xs []*tensor.Tensor
		for k := range 3 {
			x, err := e.fill(tensor.Float32, 100+k, func(i int) float64 { return float64(e.r + k) })
			if err != nil {
				return err
			}
			defer x.Free()
			xs = append(xs, x)
		}
		before := len(e.b.pendingWorks())
		w, err := Coalesce(e.ctx, e.b, func(ctx context.Context) error {
			for _, x := range xs {
				w, err := e.b.Allreduce(ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
				if err != nil {
					return err
				}
				if w != nil {
					return errors.New("op inside a coalescing block returned a Work")
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if w == nil {
			return errors.New("no Work for the block")
		}
		added := len(e.b.pendingWorks()) - before
		if added > 1 {
			return fmt.Errorf("%d works enqueued for one block", added)
		}
		if err := w.Wait(e.ctx); err != nil {
			return err
		}
		for k, x := range xs {
			got, err := e.read(x)
			if err != nil {
				return err
			}
			want := float64(e.n*k) + sumRanks(e.n) - float64(e.n)
			if err := expect(got, func(int) float64 { return want }); err != nil {
				return fmt.Errorf("tensor %d: %w", k, err)
			}
		}
		return nil
	})
}

// P2P: send/recv on the pair communicator, and a batch inside a block.
func TestP2P(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	if len(envs) < 2 {
		t.Skip("needs 2 GPUs")
	}
	envs = envs[:2]
	each(t, envs, func(e *rankEnv) error {
		peer := 1 - e.r
		x, err := e.fill(tensor.Float32, n, func(i int) float64 { return float64(10*e.r + i%7) })
		if err != nil {
			return err
		}
		defer x.Free()
		y, err := cuda.Zeros(e.ctx, e.r, tensor.Float32, n)
		if err != nil {
			return err
		}
		defer y.Free()
		// Pair communicator: rank 0 sends, rank 1 receives, then back.
		for round := range 2 {
			var w backend.Work
			if e.r == round {
				w, err = e.b.Send(e.ctx, e.meta(backend.OpSend), []*tensor.Tensor{x}, peer, backend.SendOptions{Async: true})
			} else {
				w, err = e.b.Recv(e.ctx, e.meta(backend.OpRecv), []*tensor.Tensor{y}, peer, backend.RecvOptions{Async: true})
			}
			if err != nil {
				return err
			}
			if err := w.Wait(e.ctx); err != nil {
				return err
			}
		}
		got, err := e.read(y)
		if err != nil {
			return err
		}
		if err := expect(got, func(i int) float64 { return float64(10*peer + i%7) }); err != nil {
			return err
		}
		if _, ok := e.b.p2p[[2]int{0, 1}]; !ok {
			return errors.New("no pair communicator 0:1")
		}
		// batch_isend_irecv: both directions in one block.
		z, _ := cuda.Zeros(e.ctx, e.r, tensor.Float32, n)
		defer z.Free()
		w, err := Coalesce(e.ctx, e.b, func(ctx context.Context) error {
			if _, err := e.b.Send(ctx, e.meta(backend.OpSend), []*tensor.Tensor{x}, peer, backend.SendOptions{}); err != nil {
				return err
			}
			_, err := e.b.Recv(ctx, e.meta(backend.OpRecv), []*tensor.Tensor{z}, peer, backend.RecvOptions{})
			return err
		})
		if err != nil {
			return err
		}
		w.Wait(e.ctx)
		got, err = e.read(z)
		if err != nil {
			return err
		}
		return expect(got, func(i int) float64 { return float64(10*peer + i%7) })
	})
}

func TestTimingAndFuture(t *testing.T) {
	o := testOpts()
	o.EnableTiming = true
	envs := newRanks(t, 0, o)
	each(t, envs, func(e *rankEnv) error {
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		f := w.Future()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.WaitHost(wctx); err != nil {
			return err
		}
		if st, err := w.IsStarted(); err != nil || !st {
			return fmt.Errorf("IsStarted %v %v", st, err)
		}
		d, err := w.Duration()
		if err != nil || d <= 0 {
			return fmt.Errorf("Duration %v %v", d, err)
		}
		if vals, err := f.Wait(wctx); err != nil || len(vals) != 0 && vals[0] != x {
			return fmt.Errorf("future: %v %v", vals, err)
		}
		return w.Wait(e.ctx)
	})
}

// Ops captured into a CUDA graph are not handed to the watchdog.
func TestGraphCaptureSkipsWatchdog(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	each(t, envs, func(e *rankEnv) error {
		x, err := ones(e)
		if err != nil {
			return err
		}
		defer x.Free()
		// Warm up: the first collective connects the peers, which is not
		// capturable.
		if _, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
			return err
		}
		e.cur.Memset32(x.Ptr(), f32bits(float32(e.r+1)), n)
		e.cur.Synchronize()
		before := len(e.b.pendingWorks())
		unlock := lockThread()
		defer unlock()
		if err := e.cur.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
			return err
		}
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{})
		gr, err2 := e.cur.EndCapture()
		if err != nil || err2 != nil {
			return errors.Join(err, err2)
		}
		defer gr.Destroy()
		after := len(e.b.pendingWorks())
		if after > before {
			return fmt.Errorf("captured op enqueued to the watchdog (%d -> %d)", before, after)
		}
		if cr, ok := w.(backend.CaptureReporter); !ok || !cr.Captured() {
			return errors.New("the Work of a captured op does not report it captured")
		}
		if !w.IsCompleted() || w.Exception() != nil {
			return fmt.Errorf("captured op: IsCompleted %v, Exception %v; want true, nil", w.IsCompleted(), w.Exception())
		}
		if err := gr.Launch(e.cur); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return sumRanks(e.n) })
	})
}

// BAND, BOR and BXOR are refused with PyTorch's message.
func TestBitwiseUnsupported(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	e := envs[0]
	x, err := e.fill(tensor.Int32, 4, func(int) float64 { return 1 })
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	_, err = e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: backend.BAND})
	if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "Cannot use ReduceOp.BAND with NCCL") {
		t.Fatalf("BAND: %v", err)
	}
}

// Init variants: nonblocking, scalable (forced), split from a parent.
func TestInitVariants(t *testing.T) {
	check := func(t *testing.T, envs []*rankEnv) {
		each(t, envs, func(e *rankEnv) error {
			x, err := ones(e)
			if err != nil {
				return err
			}
			defer x.Free()
			if _, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{}); err != nil {
				return err
			}
			return e.expect(x, func(int) float64 { return sumRanks(e.n) })
		})
	}
	t.Run("nonblocking", func(t *testing.T) {
		o := testOpts()
		o.NonBlocking = true
		envs := newRanks(t, 0, o)
		if !envs[0].b.devComms[0].Load().nb {
			t.Fatal("communicator not nonblocking")
		}
		check(t, envs)
	})
	t.Run("scalable", func(t *testing.T) {
		o := testOpts()
		o.RanksPerRoot = 1
		check(t, newRanksKnobs(t, 0, o, ncclhook.Knobs{ForceScalableInit: true}))
	})
	t.Run("split", func(t *testing.T) {
		parents := newRanks(t, 0, testOpts())
		st := store.NewHashStore()
		each(t, parents, func(e *rankEnv) error {
			all := make([]int, e.n)
			for i := range all {
				all[i] = i
			}
			dev := tensor.CUDADevice(e.r)
			child, err := New(context.Background(), backend.Config{Store: st, Rank: e.r, WorldSize: e.n, GlobalRanks: all,
				GroupName: "1", GroupDesc: "child", Device: &dev, Options: testOpts(), Parent: e.b})
			if err != nil {
				return err
			}
			e.b = child // the child serves the check below
			if n, _ := st.NumKeys(context.Background()); n != 0 {
				return fmt.Errorf("split went through the store (%d keys)", n)
			}
			return nil
		})
		check(t, parents)
	})
}

// A rank whose rank 0 never publishes the unique id gets an error naming
// rank 0.
func TestRankZeroNeverPublishes(t *testing.T) {
	gpus(t)
	st := store.NewHashStore()
	st.SetTimeout(300 * time.Millisecond)
	dev := tensor.CUDADevice(0)
	_, err := New(context.Background(), backend.Config{Store: st, Rank: 1, WorldSize: 2, Device: &dev, Options: testOpts()})
	if err == nil || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("want an error naming rank 0, got %v", err)
	}
	t.Log(err)
}

func TestUnavailableWithoutLibrary(t *testing.T) {
	if Load() == nil {
		t.Skip("NCCL is present")
	}
	_, err := New(context.Background(), backend.Config{Store: store.NewHashStore(), Rank: 0, WorldSize: 1})
	if !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("want ErrUnavailable, got %v", err)
	}
	if !strings.Contains(err.Error(), "GOCOLL_") {
		t.Fatalf("error should name the variable: %v", err)
	}
}

func f32bits(f float32) uint32 { return math.Float32bits(f) }
