package cpupool

import (
	"context"

	"github.com/gocoll/gocoll/backend"
	"sync"
	"sync/atomic"
	"time"
)

// jobCtx is the context an op runs under: its caller's values, not its
// cancellation (the op goes on for the peers), and the op's own deadline.
//
// It is context.WithTimeout(context.WithoutCancel(ctx), timeout) made
// lazy, because that cost a small allreduce a runtime timer (added at
// issue, removed at completion), three allocations and a lock or two,
// about 1 µs of the 8 B op's CPU time on this machine (the profile in
// docs/perf.md, issue 17). A lane op never asks for Done: its waits poll
// the ring and ask Err and Deadline only once they park. So the channel
// and the timer that closes it at the deadline are made by the first Done
// (a ring op's select, a context derived from this one); until then Err
// compares the clock with the deadline itself.
type jobCtx struct {
	parent context.Context // for Value only: never cancelled
	// deadline is a backend.Mono reading (zero: none), not a time.Time:
	// building one per op (time.Time.Add) was about 1 % of a 2-rank 8 B
	// allreduce, and only Deadline needs it, which a lane op never calls.
	deadline time.Duration
	state    atomic.Int32 // live, or how it ended: ctxCanceled, ctxExpired

	// made is set (under mu) once done exists: until then, ending the
	// context takes no lock (a small op's cancel at completion).
	made   atomic.Bool
	mu     sync.Mutex
	done   chan struct{} // made by the first Done
	closed bool          // done is closed
	timer  *time.Timer   // closes done at the deadline, once done exists
}

// The states of a jobCtx that ended.
const (
	ctxCanceled = 1
	ctxExpired  = 2
)

// init sets c up with ctx's values and a deadline timeout after issued
// (a backend.Mono reading; zero: now), none when timeout <= 0. The parent
// is context.WithoutCancel(ctx), so that what looks for a cancelable
// ancestor through Value (context.Cause, a derived context) finds none
// rather than the caller's.
func (c *jobCtx) init(ctx context.Context, timeout, issued time.Duration) {
	c.parent = ctx
	if ctx.Done() != nil {
		// Background and the like (no Done) have no cancelable ancestor:
		// the allocation is saved for them.
		c.parent = context.WithoutCancel(ctx)
	}
	if timeout > 0 {
		// The dispatcher's reading of the clock when it has one
		// (Meta.Issued), else one monotonic read (time.Now reads the
		// wall clock too).
		if issued == 0 {
			issued = backend.Mono()
		}
		c.deadline = issued + timeout
	}
}

// Deadline implements context.Context.
func (c *jobCtx) Deadline() (time.Time, bool) {
	if c.deadline == 0 {
		return time.Time{}, false
	}
	return backend.MonoTime(c.deadline), true
}

// Value implements context.Context.
func (c *jobCtx) Value(key any) any { return c.parent.Value(key) }

// Err implements context.Context: DeadlineExceeded once the deadline has
// passed (whether or not a timer has fired yet), Canceled after cancel.
func (c *jobCtx) Err() error {
	s := c.state.Load()
	if s == 0 && c.deadline != 0 && backend.Mono() >= c.deadline {
		c.end(ctxExpired)
		s = c.state.Load()
	}
	switch s {
	case ctxCanceled:
		return context.Canceled
	case ctxExpired:
		return context.DeadlineExceeded
	}
	return nil
}

// Done implements context.Context; the first call makes the channel and,
// with a deadline, the timer that closes it.
func (c *jobCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		// Published before state is looked at, as end sets state
		// before it looks at made: one of the two sees the other.
		c.made.Store(true)
		switch {
		case c.state.Load() != 0:
			close(c.done)
			c.closed = true
		case c.deadline != 0:
			c.timer = time.AfterFunc(c.deadline-backend.Mono(), func() { c.end(ctxExpired) })
		}
	}
	return c.done
}

// cancel ends the context with Canceled, unless it ended already, and
// releases its timer.
func (c *jobCtx) cancel() { c.end(ctxCanceled) }

// end records the first way the context ended and closes done if it
// exists, and stops its timer.
func (c *jobCtx) end(state int32) {
	if c.state.Load() != 0 || !c.state.CompareAndSwap(0, state) {
		return
	}
	if !c.made.Load() {
		return // no channel yet: Done will see the state and close it
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		close(c.done)
		c.closed = true
	}
	if c.timer != nil {
		c.timer.Stop()
	}
}

// String names the context, as the context package's do.
func (c *jobCtx) String() string { return "cpupool.jobCtx" }
