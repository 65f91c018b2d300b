package cpupool

import (
	"sync"
	"sync/atomic"
	"time"
)

// lazyWake is how long a job pushed onto an empty queue waits for its
// caller to run it (work.Wait) before a worker is woken for it, while
// callers leave jobs to the workers; lazyMax is how long it may grow to
// while callers run their jobs themselves (queue.nudged).
const (
	lazyWake = 200 * time.Microsecond
	lazyMax  = 2 * time.Millisecond
)

// queue is the unbounded FIFO of collectives waiting for a worker; 1000
// ops in flight must not block the caller.
//
// A job pushed onto an empty queue does not wake an idle worker at once:
// the caller usually waits for it right away and then runs it itself
// (work.Wait), and waking a worker that finds nothing costs a core that
// the peer needs on a small machine. The nudge timer wakes one after
// lazy, in case nobody waits; a queue with a backlog wakes workers at
// once, and each worker that pops a job with more behind it wakes the next.
//
// The nudge's period adapts: each time it finds that the callers took
// their jobs themselves, the next period doubles, up to lazyMax; each time
// it has to wake a worker, it drops back to lazyWake. Every period costs
// the process two thread wake-ups (the timer's arming wakes the runtime's
// poller, and its firing wakes it again), and with more ranks than cores
// each wake-up takes a core from a rank that is in the middle of an op:
// at 200 µs, 4 ranks on 2 cores spent 10-20 % of an 8 B allreduce on them
// (docs/perf.md, issue 17, fourth pass).
type queue struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []*job
	head   int
	closed error
	idle   int           // workers parked in cond.Wait
	lazy   time.Duration // the nudge's base period (lazyWake)
	period time.Duration // its current period, lazy to lazyMax
	nudge  *time.Timer
	armed  bool   // nudge is set
	pops   uint64 // jobs removed so far (popped or taken)
	seen   uint64 // pops when nudge was set
	// n is how many jobs are queued (len(items) - head), written under
	// mu: kick looks at it without the lock, as most kicks (one per lane
	// op, after its run) find the queue empty.
	n atomic.Int32
	// ready, when set, says whether a job at the head may be popped now
	// (a lane op only in its turn: lanes.go); others wait behind it.
	ready func(*job) bool
	// owner, when set, holds the deferred lane ops (deferred.go), which
	// every push, an idle worker's pop, the nudge and close take out of
	// its ring into the queue first; armedA is armed, for its look
	// without mu (armDeferred).
	owner  *Backend
	armedA atomic.Bool
}

// init sets the queue up; lazy <= 0 wakes a worker on every push.
func (q *queue) init(lazy time.Duration) {
	q.cond.L = &q.mu
	q.lazy, q.period = lazy, lazy
	if lazy > 0 {
		q.nudge = time.AfterFunc(time.Hour, q.nudged)
		q.nudge.Stop()
	}
}

// nudged is the nudge timer's function: a worker is woken if no job
// left the queue since the timer was set (nobody runs them), and the
// period drops back to lazy; if some did, their waiters are at work: the
// period grows and, with jobs still queued, the timer is set again.
func (q *queue) nudged() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.armed = false
	q.armedA.Store(false)
	if q.closed != nil {
		return
	}
	pending := q.deferredPending()
	if (q.head == len(q.items) && !pending) || q.progress() != q.seen {
		q.period = min(2*q.period, max(lazyMax, q.lazy))
		if q.head != len(q.items) || pending {
			q.armLocked()
		}
		return
	}
	// Nobody took a job or ran a deferred op for a period: the deferred
	// ops, if any, go to the queue, and a worker is woken. The timer is
	// set again while jobs wait: the worker finds the head's turn not
	// come when a Wait is running the lane op before it, and the runner
	// kicks a worker only for a head job that somebody waits for (kick).
	q.flushLocked()
	q.period = q.lazy
	q.cond.Signal()
	if q.head != len(q.items) {
		q.armLocked()
	}
}

// progress counts what left the queue or the deferred ring by being run;
// q.mu is held.
func (q *queue) progress() uint64 {
	if q.owner == nil {
		return q.pops
	}
	return q.pops + q.owner.dRuns.Load()
}

// deferredPending reports whether a deferred lane op waits in the ring.
func (q *queue) deferredPending() bool { return q.owner != nil && q.owner.dq.waiting.Load() != 0 }

// flushLocked appends the deferred lane ops waiting in the ring, oldest first, to
// the queue, ahead of whatever is queued after; q.mu is held.
func (q *queue) flushLocked() {
	if q.owner == nil {
		return
	}
	for j := q.owner.flushDeferred(); j != nil; j = q.owner.flushDeferred() {
		q.items = append(q.items, j)
		q.n.Add(1)
	}
}

// armDeferred sets the nudge timer for a deferred lane op (unless it is
// set), so that a worker runs the op if nobody waits for it.
func (q *queue) armDeferred() {
	if q.armedA.Load() {
		return
	}
	q.mu.Lock()
	if q.closed == nil {
		q.armLocked()
	}
	q.mu.Unlock()
}

// armLocked sets the nudge timer unless it is set; q.mu is held. Setting
// it once per lazy period rather than on every push saves a timer
// update (a lock and the timer heap) per small op.
func (q *queue) armLocked() {
	if !q.armed {
		q.armed, q.seen = true, q.progress()
		q.armedA.Store(true)
		q.nudge.Reset(q.period)
	}
}

// push queues j. A lane op wakes no worker: its caller runs it, with the
// lane ops queued before it, when it waits (help); the nudge wakes one if
// nobody has taken a job for lazy.
func (q *queue) push(j *job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil {
		return false
	}
	q.flushLocked()
	q.items = append(q.items, j)
	q.n.Add(1)
	if q.idle > 0 {
		if q.nudge != nil && (j.lane || len(q.items)-q.head == 1) {
			if !j.atOnce { // else its Wait, due at once, runs it
				q.armLocked()
			}
		} else {
			q.cond.Signal()
		}
	}
	return true
}

func (q *queue) pop() *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	for (q.head == len(q.items) || !q.headReady()) && q.closed == nil {
		if q.head == len(q.items) && q.deferredPending() {
			q.flushLocked()
			continue
		}
		q.idle++
		q.cond.Wait()
		q.idle--
	}
	if q.head == len(q.items) {
		return nil
	}
	return q.popHeadLocked()
}

// headReady reports whether the head job may be popped; q.mu is held and
// the queue is not empty.
func (q *queue) headReady() bool { return q.ready == nil || q.ready(q.items[q.head]) }

// popHeadLocked removes the head job; q.mu is held.
func (q *queue) popHeadLocked() *job {
	j := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	q.pops++
	q.n.Add(-1)
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.idle > 0 && q.headReady() {
		q.cond.Signal() // more work behind this job: wake the next worker
	}
	return j
}

// take removes j if it is the next job a worker would pop, so the caller
// may run it instead; FIFO order is kept because only the head is taken.
func (q *queue) take(j *job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed != nil || q.head == len(q.items) || q.items[q.head] != j {
		return false
	}
	q.items[q.head] = nil
	q.head++
	q.pops++
	q.n.Add(-1)
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return true
}

// close stops the workers; queued jobs fail with err.
func (q *queue) close(err error) {
	q.mu.Lock()
	q.flushLocked()
	q.closed = err
	if q.nudge != nil {
		q.nudge.Stop()
	}
	rest := q.items[q.head:]
	q.items, q.head = nil, 0
	q.n.Store(0)
	q.cond.Broadcast()
	q.mu.Unlock()
	for _, j := range rest {
		j.w.Complete(nil, err)
		j.cancel()
	}
}
