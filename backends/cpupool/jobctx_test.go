package cpupool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
)

type ctxKey struct{}

// TestJobCtx checks the lazy job context against what
// context.WithTimeout(context.WithoutCancel(ctx), d) does: the deadline
// ends it whether or not Done was asked for, cancel ends it with
// Canceled, a cancelled parent does not, and values pass through.
func TestJobCtx(t *testing.T) {
	parent, stop := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	stop() // the job outlives its caller's context

	var c jobCtx
	c.init(parent, 30*time.Millisecond, 0)
	if c.Err() != nil {
		t.Fatalf("fresh context: Err %v", c.Err())
	}
	if got := c.Value(ctxKey{}); got != "v" {
		t.Fatalf("Value = %v, want v", got)
	}
	if dl, ok := c.Deadline(); !ok || time.Until(dl) > 30*time.Millisecond {
		t.Fatalf("Deadline = %v, %v", dl, ok)
	}
	if context.Cause(&c) != nil {
		t.Fatalf("Cause of a live job context: %v (the caller's?)", context.Cause(&c))
	}
	time.Sleep(40 * time.Millisecond)
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline, no Done asked: Err %v", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done made after the deadline is not closed")
	}
	c.cancel()
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("cancel after the deadline changed Err to %v", c.Err())
	}

	// Done asked first: the timer closes it.
	var d jobCtx
	issued := backend.Mono() - 10*time.Millisecond // the dispatcher's reading (Meta.Issued)
	d.init(context.Background(), 20*time.Millisecond, issued)
	if dl, ok := d.Deadline(); !ok || !dl.Equal(backend.MonoTime(issued+20*time.Millisecond)) {
		t.Fatalf("deadline %v, want 20 ms after the issue", dl)
	}
	child, cc := context.WithCancel(&d)
	defer cc()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a context derived from a job context did not end at its deadline")
	}
	if !errors.Is(d.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.Canceled) && !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err %v, child %v", d.Err(), child.Err())
	}

	// No deadline: only cancel ends it, and closes a Done made before.
	var e jobCtx
	e.init(context.Background(), 0, 0)
	if _, ok := e.Deadline(); ok {
		t.Fatal("deadline without a timeout")
	}
	done := e.Done()
	e.cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not close Done")
	}
	if !errors.Is(e.Err(), context.Canceled) {
		t.Fatalf("Err %v, want Canceled", e.Err())
	}
}

// TestJobCtxRace races the first Done with cancel and with the deadline
// (run it with -race): cancel takes no lock while no Done exists, so the
// two must still agree that the channel gets closed, once.
func TestJobCtxRace(t *testing.T) {
	for i := range 2000 {
		var c jobCtx
		c.init(context.Background(), time.Duration(i%3)*time.Microsecond, 0)
		start := make(chan struct{})
		got := make(chan (<-chan struct{}), 1)
		go func() { <-start; got <- c.Done() }()
		close(start)
		c.cancel()
		select {
		case <-<-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Done made around cancel never closed", i)
		}
		if c.Err() == nil {
			t.Fatalf("round %d: no error after cancel", i)
		}
	}
}
