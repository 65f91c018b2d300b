package nccl

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// curStreamOpts are testOpts with async ops on the current stream.
func curStreamOpts() Options {
	o := testOpts()
	o.AsyncOnCurrentStream = true
	return o
}

// heldOnes returns a tensor of ones, filled, and a gate that holds the
// current stream after it; done opens the gate, then frees both (an Open
// after Free would write to freed pinned memory).
func heldOnes(e *rankEnv) (x *tensor.Tensor, g *cuda.Gate, done func(), err error) {
	if x, err = ones(e); err != nil {
		return nil, nil, nil, err
	}
	if err = e.cur.Synchronize(); err == nil {
		g, err = e.dev.NewGate()
	}
	if err != nil {
		x.Free()
		return nil, nil, nil, err
	}
	done = func() {
		g.Open()
		g.Free()
		x.Free()
	}
	if err = g.Hold(e.cur); err != nil {
		done()
		return nil, nil, nil, err
	}
	return x, g, done, nil
}

// TestAsyncOnCurrentStream: with Options.AsyncOnCurrentStream an async op
// is queued on the current stream. Held behind a gate there, it returns at
// once and does not complete; a gate on the internal stream does not hold
// it (it makes no stream wait there); Wait on the same stream returns
// without blocking the host; Wait under another stream orders that stream
// after the op; WaitHost with a short deadline ends with the caller's
// deadline; nothing is stashed (the tensor's free is ordered on the op's
// stream: TestCurrentStreamStash); once the gate opens the
// op completes with the reduced values and the other stream's copy sees
// them.
func TestAsyncOnCurrentStream(t *testing.T) {
	envs := newRanks(t, 0, curStreamOpts())
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
		internal, err := e.b.Stream(e.ctx, e.r)
		if err != nil {
			return err
		}
		pin, err := e.dev.HostAlloc(4*n, 0)
		if err != nil {
			return err
		}
		defer pin.Free()
		ev, err := e.dev.NewEvent(false)
		if err != nil {
			return err
		}
		defer ev.Destroy()
		// One op first: the event pool exists before the gates close (no
		// device-wide call while one is held).
		w0, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if err := w0.Wait(e.ctx); err != nil {
			return err
		}
		if err := e.cur.Synchronize(); err != nil {
			return err
		}
		// x is now sumRanks; the op below reduces it again.
		want := sumRanks(e.n) * float64(e.n)
		gi, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer gi.Free()
		defer gi.Open()
		gc, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer gc.Free()
		defer gc.Open()
		if err := gi.Hold(internal); err != nil {
			return err
		}
		if err := gc.Hold(e.cur); err != nil {
			return err
		}
		t0 := time.Now()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if d := time.Since(t0); d > 200*time.Millisecond {
			return fmt.Errorf("async allreduce took %v to return", d)
		}
		wk := w.(*Work)
		if got := wk.Stream().Handle(); got != e.cur.Handle() {
			return fmt.Errorf("op ran on stream %#x, want the current stream %#x", got, e.cur.Handle())
		}
		// x was allocated on the op's stream, which orders its free after
		// the op: nothing to stash (TestCurrentStreamStash).
		if n := wk.stashHeld(); n != 0 {
			return fmt.Errorf("%d tensors stashed before Wait, want 0 (x's free is ordered on the op's stream)", n)
		}
		// Wait under the other stream: it must order that stream.
		ctxB := cuda.WithStream(context.Background(), other)
		if err := w.Wait(ctxB); err != nil {
			return err
		}
		if err := cuda.CopyToPinned(ctxB, pin, x); err != nil {
			return err
		}
		if err := ev.Record(other); err != nil {
			return err
		}
		// Wait on its own stream: nothing to order, and the host goes on.
		t0 = time.Now()
		if err := w.Wait(e.ctx); err != nil {
			return err
		}
		if d := time.Since(t0); d > 100*time.Millisecond {
			return fmt.Errorf("Wait blocked the host for %v", d)
		}
		if n := wk.stashHeld(); n != 0 {
			return fmt.Errorf("%d tensors still stashed after Wait", n)
		}
		// The internal stream's gate stays closed: it must not hold the op.
		gc.Open()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.WaitHost(wctx); err != nil {
			return fmt.Errorf("op held by the internal stream's gate (or failed): %w", err)
		}
		if !w.IsCompleted() {
			return errors.New("IsCompleted false after WaitHost")
		}
		if err := ev.Wait(wctx); err != nil {
			return err
		}
		if v := pinnedF32(pin, n-1); v != want {
			return fmt.Errorf("the other stream saw %v after Wait, want the reduced %v", v, want)
		}
		gi.Open()
		return e.expect(x, func(int) float64 { return want })
	})
}

// TestAsyncOnCurrentStreamHeld: while the current stream is held the op
// does not complete, WaitHost ends with the caller's deadline (not the
// op's), and IsCompleted stays false; after the gate opens it completes.
func TestAsyncOnCurrentStreamHeld(t *testing.T) {
	envs := newRanks(t, 0, curStreamOpts())
	each(t, envs, func(e *rankEnv) error {
		x, g, done, err := heldOnes(e)
		if err != nil {
			return err
		}
		defer done()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if err := w.Wait(e.ctx); err != nil {
			return err
		}
		short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err = w.WaitHost(short)
		var we *backend.WaitError
		if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("WaitHost on a held op: %v, want the caller's deadline (*backend.WaitError)", err)
		}
		if w.IsCompleted() {
			return errors.New("IsCompleted true while the op's stream is held")
		}
		g.Open()
		wctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel2()
		if err := w.WaitHost(wctx); err != nil {
			return err
		}
		return e.expect(x, func(int) float64 { return sumRanks(e.n) })
	})
}

// TestAsyncOnCurrentStreamTimeout: the watchdog times out an op of this
// mode held on the current stream past its timeout (NoHandling: the Work
// fails with ErrTimeout, nothing else happens), and a later op, once the
// stream runs again, completes.
func TestAsyncOnCurrentStreamTimeout(t *testing.T) {
	o := curStreamOpts()
	o.WatchdogInterval = 10 * time.Millisecond
	envs := newRanks(t, 0, o)
	each(t, envs, func(e *rankEnv) error {
		x, g, done, err := heldOnes(e)
		if err != nil {
			return err
		}
		defer done()
		m := e.meta(backend.OpAllreduce)
		m.Timeout = 100 * time.Millisecond
		w, err := e.b.Allreduce(e.ctx, m, []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for w.Exception() == nil && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if err := w.Exception(); !errors.Is(err, backend.ErrTimeout) {
			return fmt.Errorf("held op's error: %v, want ErrTimeout from the watchdog", err)
		}
		if w.IsCompleted() != true { // finished: failed
			return errors.New("a timed-out op must count as finished")
		}
		g.Open()
		w2, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w2.WaitHost(wctx); err != nil {
			return err
		}
		// Both ops ran: the timed-out one was only held, not dropped.
		return e.expect(x, func(int) float64 { return sumRanks(e.n) * float64(e.n) })
	})
}

// TestStashOutlivesCurrentStream: with Options.AsyncOnCurrentStream, the
// caller frees the op's tensor and destroys the stream it was allocated
// on and the one it ran on, with work still queued there (behind a gate), without
// calling Wait; the watchdog hands the stash over, and the next op (on
// another stream) releases it. The last reference must free the memory
// without the destroyed stream's handle: before the fix this crashed in
// cuMemFreeAsync (the conftest suite under
// GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM=1, nvidia-h200, 2026-12-01). Close
// then releases the stashes of ops never waited on whose streams are gone.
func TestStashOutlivesCurrentStream(t *testing.T) {
	o := curStreamOpts()
	o.WatchdogInterval = 10 * time.Millisecond
	e := newRanks(t, 1, o)[0]
	y, err := ones(e)
	if err != nil {
		t.Fatal(err)
	}
	defer y.Free()
	next := func() {
		t.Helper()
		w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{y}, backend.AllreduceOptions{Async: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	next() // the event pool exists before a gate closes
	// issue runs one async allreduce on a new stream and destroys the
	// stream; with gate, work stays queued there behind it.
	issue := func(gate *cuda.Gate) backend.Work {
		t.Helper()
		s, err := e.dev.NewStream(cuda.StreamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// x lives on a stream of its own, destroyed too, so that the op
		// (on s) stashes it: memory freed in order on the op's stream
		// needs no stash (TestCurrentStreamStash).
		s2, err := e.dev.NewStream(cuda.StreamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es := *e
		es.cur, es.ctx = s2, cuda.WithStream(context.Background(), s2)
		x, err := ones(&es)
		if err != nil {
			t.Fatal(err)
		}
		if err := s2.Synchronize(); err != nil {
			t.Fatal(err)
		}
		es.cur, es.ctx = s, cuda.WithStream(context.Background(), s)
		w, err := e.b.Allreduce(es.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			t.Fatal(err)
		}
		if gate != nil {
			if err := gate.Hold(s); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Free(); err != nil {
			t.Fatal(err)
		}
		if err := s.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := s2.Destroy(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.WaitHost(ctx); err != nil {
			t.Fatal(err)
		}
		return w
	}
	for range 4 {
		g, err := e.dev.NewGate()
		if err != nil {
			t.Fatal(err)
		}
		defer g.Free()
		defer g.Open() // first: a failing round must not leave the device gated for Close
		wk := issue(g).(*Work)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			left := wk.stashHeld()
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the watchdog did not take the stash of a completed, unwaited op")
			}
		}
		next() // releases the stash handed over, while the stream's gate is closed
		g.Open()
	}
	for range 4 {
		issue(nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.b.Close(ctx); err != nil {
		t.Fatalf("Close after the current streams were destroyed: %v", err)
	}
}

// TestCurrentStreamStash: with Options.AsyncOnCurrentStream, an async op
// stashes a tensor allocated on another stream until Wait (its free is
// queued there, in no order with the op), and stashes none allocated on
// the op's own stream, whose free comes after the op in that stream's
// order; both results are right after a free before Wait. In the default
// mode (the internal stream) a tensor of the current stream is stashed.
func TestCurrentStreamStash(t *testing.T) {
	for _, cur := range []bool{true, false} {
		o := testOpts()
		o.AsyncOnCurrentStream = cur
		e := newRanks(t, 1, o)[0]
		other, err := e.dev.NewStream(cuda.StreamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eo := *e
		eo.cur, eo.ctx = other, cuda.WithStream(context.Background(), other)
		for _, c := range []struct {
			name string
			on   *rankEnv
			want int
		}{{"own stream", e, 0}, {"other stream", &eo, 1}} {
			if !cur {
				c.want = 1
			}
			x, err := ones(c.on)
			if err != nil {
				t.Fatal(err)
			}
			if err := other.Synchronize(); err != nil {
				t.Fatal(err)
			}
			w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
			if err != nil {
				t.Fatal(err)
			}
			if n := w.(*Work).stashHeld(); n != c.want {
				t.Errorf("current stream %v, tensor on the %s: %d stashed before Wait, want %d", cur, c.name, n, c.want)
			}
			if err := x.Free(); err != nil {
				t.Fatal(err)
			}
			if err := w.Wait(e.ctx); err != nil {
				t.Fatal(err)
			}
			if n := w.(*Work).stashHeld(); n != 0 {
				t.Errorf("current stream %v, tensor on the %s: %d stashed after Wait", cur, c.name, n)
			}
			if err := e.cur.Synchronize(); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
}
