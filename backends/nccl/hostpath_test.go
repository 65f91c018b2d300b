package nccl

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// TestAsyncOnInternalStream: with the internal stream current (a Work's
// Stream()), an async op skips the sync event, and stream order alone
// keeps it behind the work queued before it there: held behind a gate
// with a write of its input, it does not complete until the gate opens,
// and then reduces the written values; Wait on that stream returns.
func TestAsyncOnInternalStream(t *testing.T) {
	envs := newRanks(t, 0, testOpts())
	const n = 1024
	each(t, envs, func(e *rankEnv) error {
		x, err := cuda.Zeros(e.ctx, e.r, tensor.Float32, n)
		if err != nil {
			return err
		}
		defer x.Free()
		// One op first: the communicator, its stream and its event pool
		// exist before the gate closes (no device-wide call while held).
		w0, err := e.b.Allreduce(e.ctx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if err := w0.Wait(e.ctx); err != nil {
			return err
		}
		internal := w0.(*Work).Stream()
		if err := e.cur.Synchronize(); err != nil {
			return err
		}
		if err := internal.Synchronize(); err != nil {
			return err
		}
		g, err := e.dev.NewGate()
		if err != nil {
			return err
		}
		defer g.Free()
		defer g.Open()
		ictx := cuda.WithStream(e.ctx, internal)
		if err := g.Hold(internal); err != nil {
			return err
		}
		if err := internal.Memset32(x.Ptr(), f32bits(float32(e.r+2)), n); err != nil {
			return err
		}
		w, err := e.b.Allreduce(ictx, e.meta(backend.OpAllreduce), []*tensor.Tensor{x}, backend.AllreduceOptions{Async: true})
		if err != nil {
			return err
		}
		if got := w.(*Work).Stream().Handle(); got != internal.Handle() {
			return fmt.Errorf("op ran on stream %#x, want the internal stream %#x", got, internal.Handle())
		}
		time.Sleep(30 * time.Millisecond)
		if w.IsCompleted() {
			return fmt.Errorf("op completed while the write before it on its stream was held")
		}
		if err := w.Wait(ictx); err != nil {
			return err
		}
		g.Open()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := w.WaitHost(wctx); err != nil {
			return err
		}
		if err := internal.Synchronize(); err != nil {
			return err
		}
		sum := 0.0
		for r := range e.n {
			sum += float64(r + 2)
		}
		return e.expect(x, func(int) float64 { return sum })
	})
}

// TestWorkLayout: the Work stays in its 144-byte size class (each op
// allocates one: a larger Work is more memory to allocate, zero and scan
// per op, session 5's profile), with what only some ops need out of it.
func TestWorkLayout(t *testing.T) {
	if n := unsafe.Sizeof(Work{}); n > 144 {
		t.Fatalf("Work is %d bytes, past its 144-byte size class: move fields that few ops need into workIssue or workLate", n)
	}
}

// TestWorkExtras: an async coalesced allgather of two tensors at world 1
// stashes its four tensors (two past the Work's own slots, in workIssue)
// until Wait, and its Future completes with its outputs (workIssue too)
// and its events come back; a timed op reports a duration (its start
// event, in workIssue).
func TestWorkExtras(t *testing.T) {
	o := testOpts()
	o.EnableTiming = true
	e := newRanks(t, 1, o)[0]
	var ins, outs []*tensor.Tensor
	for range 2 {
		for _, l := range []*[]*tensor.Tensor{&ins, &outs} {
			x, err := ones(e)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Free()
			*l = append(*l, x)
		}
	}
	w, err := e.b.AllgatherCoalesced(e.ctx, e.meta(backend.OpAllgatherCoalesced), [][]*tensor.Tensor{{outs[0]}, {outs[1]}}, ins, backend.AllgatherCoalescedOptions{Async: true})
	if err != nil {
		t.Fatal(err)
	}
	wk := w.(*Work)
	if n := wk.stashHeld(); n != 4 {
		t.Fatalf("%d tensors stashed before Wait, want 4", n)
	}
	f := w.Future()
	if err := w.Wait(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := wk.stashHeld(); n != 0 {
		t.Fatalf("%d tensors stashed after Wait", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := f.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != outs[0] || got[1] != outs[1] {
		t.Fatalf("Future's value %v, want the two outputs %v", got, outs)
	}
	if _, err := w.Duration(); err != nil {
		t.Fatalf("Duration of a timed op: %v", err)
	}
	if err := e.expect(outs[1], func(int) float64 { return 1 }); err != nil {
		t.Fatal(err)
	}
}
