package nccl

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// TestEarlyRetire: with the watchdog out of the way (an interval of an
// hour) and no query by the caller, a loop of async op + Wait, the stream
// drained every 256 ops, recycles its end events through the issue path's
// probes: 4096 ops make at most a few batches of events, where without
// early retirement each op takes a new one. Both modes: the internal
// stream and the current stream.
func TestEarlyRetire(t *testing.T) {
	for _, cur := range []bool{false, true} {
		t.Run(fmt.Sprintf("current-stream=%v", cur), func(t *testing.T) {
			o := testOpts()
			o.WatchdogInterval = time.Hour
			o.AsyncOnCurrentStream = cur
			e := newRanks(t, 1, o)[0]
			x, err := ones(e)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Free()
			const ops = 4096
			var first backend.Work
			for i := range ops {
				w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = w
				}
				if err := w.Wait(e.ctx); err != nil {
					t.Fatal(err)
				}
				if i%256 == 255 {
					if err := e.cur.Synchronize(); err != nil {
						t.Fatal(err)
					}
				}
			}
			c := e.b.loadComm(0)
			c.mu.Lock()
			made := c.made
			c.mu.Unlock()
			if made > 8*64 {
				t.Fatalf("%d ops made %d events: the issue path did not recycle them", ops, made)
			}
			if !first.(*Work).isDone() {
				t.Fatal("the first op is not marked complete after 4095 later ops on its stream and no query of its own")
			}
			t.Logf("%d ops, %d events made", ops, made)
		})
	}
}

// TestEarlyRetireNeverEarly: behind a closed gate nothing runs, so however
// many ops are issued (probes included), none is marked complete; once the
// gate opens they all complete, with the right result.
func TestEarlyRetireNeverEarly(t *testing.T) {
	for _, cur := range []bool{false, true} {
		t.Run(fmt.Sprintf("current-stream=%v", cur), func(t *testing.T) {
			o := testOpts()
			o.WatchdogInterval = time.Hour
			o.AsyncOnCurrentStream = cur
			e := newRanks(t, 1, o)[0]
			x, err := e.fill(tensor.Float32, 4, func(int) float64 { return 1 })
			if err != nil {
				t.Fatal(err)
			}
			defer x.Free()
			// The pool holds what the loop needs before the gate closes
			// (no device-wide call, such as creating events, while held).
			for range 512 {
				w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
				if err != nil {
					t.Fatal(err)
				}
				w.Wait(e.ctx)
			}
			if err := e.cur.Synchronize(); err != nil {
				t.Fatal(err)
			}
			// Events for the held ops, made now: nothing but stream-ordered
			// calls while the gate is closed.
			c := e.b.loadComm(0)
			c.mu.Lock()
			for len(c.free) < 256 {
				evs, err := c.dev.NewEvents(64, false)
				if err != nil {
					c.mu.Unlock()
					t.Fatal(err)
				}
				c.free = append(c.free, evs...)
			}
			c.mu.Unlock()
			// The stream the ops run on (the option's variable can turn the
			// mode on over the field).
			held := e.cur
			if !e.b.opts.AsyncOnCurrentStream {
				if held, err = e.b.Stream(e.ctx, 0); err != nil {
					t.Fatal(err)
				}
			}
			g, err := e.dev.NewGate()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free()
			defer g.Open()
			if err := g.Hold(held); err != nil {
				t.Fatal(err)
			}
			var ws []backend.Work
			for range 200 {
				w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
				if err != nil {
					t.Fatal(err)
				}
				ws = append(ws, w)
			}
			for i, w := range ws {
				if w.(*Work).isDone() {
					t.Fatalf("op %d of 200 marked complete behind a closed gate", i)
				}
			}
			g.Open()
			wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, w := range ws {
				if err := w.WaitHost(wctx); err != nil {
					t.Fatal(err)
				}
			}
			// SUM at world 1 leaves 1s.
			if err := e.expect(x, func(int) float64 { return 1 }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStashReleasedWithoutWait: an async op that is never waited on keeps
// its tensors stashed until the watchdog sees it complete; the watchdog
// then hands the stash over, and the next op releases it (PyTorch's
// workEnqueue). Nothing is left stashed.
func TestStashReleasedWithoutWait(t *testing.T) {
	o := testOpts()
	o.WatchdogInterval = 10 * time.Millisecond
	e := newRanks(t, 1, o)[0]
	x, err := ones(e)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	wk := w.(*Work)
	stashed := wk.stashHeld
	if n := stashed(); n != 1 {
		t.Fatalf("%d tensors stashed, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WaitHost(ctx); err != nil {
		t.Fatal(err)
	}
	handed := func() int {
		e.b.mu.Lock()
		defer e.b.mu.Unlock()
		return len(e.b.unstash)
	}
	// The watchdog takes the stash, then hands it over: wait for both.
	for deadline := time.Now().Add(5 * time.Second); stashed() != 0 || handed() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the watchdog did not hand over the stash of a completed, unwaited op (stashed %d, handed %d)", stashed(), handed())
		}
	}
	if n := handed(); n != 1 {
		t.Fatalf("%d retainers handed over for release, want 1", n)
	}
	w2, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	e.b.mu.Lock()
	left := len(e.b.unstash)
	e.b.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d retainers still waiting for release after the next op", left)
	}
	if err := w2.Wait(e.ctx); err != nil {
		t.Fatal(err)
	}
}
