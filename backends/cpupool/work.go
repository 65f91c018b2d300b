package cpupool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
)

// work is the Work of a collective. Its waits help: a job no worker has
// picked up yet, and that is next in the queue, runs on the waiting
// goroutine; otherwise the wait polls for completion for PollSpin before
// it parks. Either saves goroutine wake-ups (caller to worker and back),
// which dominate the latency of small ops on a busy machine. The op still
// returns before it completes, and the queue's order (issue order) is
// kept, since only its head is taken.
//
// The Work and the job are separate, so that the job can be reused. The
// Work holds what its methods answer once the op is done (the HostWork:
// outcome, outputs, times) and lives as long as anyone holds it, as the
// Work of a PyTorch op does; it is the op's one allocation, 160 bytes
// (for a small lane allreduce, a share of a slab's: workSlab).
// The job (the op's run: its context, lane view, buffers; 480 bytes)
// goes back to the Backend's pool once nothing can reach it any more
// (jobPool), rather than to the garbage collector: at 8 B, the collector
// took about a fifth of an allreduce's own CPU time (docs/perf.md,
// issue 17, fourth pass).
//
// refs counts what may still touch the job: the run (1 from issue to the
// end of runJob) and each Work method inside help or Abort (acquire,
// release). The last release returns the job to the pool if the run said
// it may (a lane allreduce that succeeded and whose context nobody
// derived from: nothing else holds the job); after that, acquire fails
// and the methods answer from the HostWork alone, which is complete.
type work struct {
	backend.HostWork
	b        *Backend
	j        *job // valid while refs > 0
	op       backend.Op
	timeout  time.Duration
	deadline time.Duration // the job context's, on the backend.Mono clock; 0: none
	refs     atomic.Int32
	// reuse is set by the run's release, before its refs.Add: the job
	// may go back to the pool. Whoever drops refs to zero reads it after
	// its own Add, which the run's precedes, so a plain field will do
	// (one locked instruction fewer per op than an atomic store).
	reuse bool
	// deferred says the op was issued into the Backend's ring
	// (deferred.go): its Wait may run it from there. Written at issue.
	deferred bool
	// inRing says the op waits in the ring: set at issue, cleared under
	// the ring's lock by whoever takes it out.
	inRing atomic.Bool
	// ranHere says the op was run from the ring by its own Wait
	// (takeDeferred), which has returned: no goroutine of the backend
	// holds the Work any more. Written and read by the Wait's goroutine
	// (the dispatcher's blocking form calls Release on it after Wait).
	ranHere bool
	// released says the caller gave the Work back (Release) once
	// ranHere: the sweep that drops it from the outstanding list
	// (sweepLocked) hands it to the slab for reuse.
	released atomic.Bool
}

// Release implements backend.Releaser. Only the Work of a deferred op
// that its Wait ran (ranHere) is reused: that of an op a worker or
// another goroutine ran may still be touched by it (the run's release,
// its Complete's last stores) after Wait returned, and is left to the
// garbage collector.
func (w *work) Release() {
	if w.ranHere {
		w.released.Store(true)
	}
}

// acquire takes a reference to the job, unless the op has completed (a
// method has nothing to help with then) or the job is gone.
func (w *work) acquire() bool {
	for {
		if w.IsCompleted() {
			return false
		}
		r := w.refs.Load()
		if r == 0 {
			return false
		}
		if w.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// release drops a reference; the run's (from runJob) says whether the job
// may be reused. The last one out puts the job back in the pool.
func (w *work) release(reuse bool) {
	if reuse {
		w.reuse = true
	}
	if w.refs.Add(-1) == 0 && w.reuse {
		j := w.j
		w.j = nil
		w.b.jobs.put(j)
	}
}

// Wait implements backend.Work.
func (w *work) Wait(ctx context.Context) error {
	if w.deferred && !w.IsCompleted() {
		if w.b.takeDeferred(w) {
			w.ranHere = true
			return w.HostWork.Wait(ctx)
		}
		w.b.awaitJob(w)
	}
	if w.acquire() {
		w.b.help(w.j, func(*job) bool { return true })
		w.release(false)
	}
	return w.HostWork.Wait(ctx)
}

// WaitHost implements backend.Work. When ctx ends first, the error (a
// *backend.WaitError) names the op and says that the caller's deadline
// fired, and whether the op's own timeout had passed.
func (w *work) WaitHost(ctx context.Context) error {
	start := backend.Mono()
	if w.deferred && !w.IsCompleted() {
		// Run from the ring only by a wait that outlasts the op's
		// deadline (outlasts' rule).
		if dl, ok := ctx.Deadline(); ctx.Done() == nil || (ok && w.deadline != 0 && backend.MonoOf(dl) >= w.deadline) {
			if w.b.takeDeferred(w) {
				return w.HostWork.WaitHost(ctx)
			}
		}
		w.b.awaitJob(w)
	}
	if w.acquire() {
		w.b.help(w.j, func(j *job) bool { return outlasts(ctx, j) })
		w.release(false)
	}
	err := w.HostWork.WaitHost(ctx)
	var we *backend.WaitError
	if errors.As(err, &we) && we.Op == "" {
		we.Op, we.Rank, we.Backend, we.Timeout = w.op.String(), w.b.cfg.Rank, Name, w.timeout
		we.Waited = backend.Mono() - start
		if w.deadline != 0 {
			we.Elapsed = w.timeout - (w.deadline - backend.Mono())
		}
	}
	return err
}

// BlockStream implements backend.Work: with no stream to order, it blocks
// the host.
func (w *work) BlockStream(backend.Stream) error { return w.Wait(context.Background()) }

// OnAbort implements backend.AbortHook: an aborted work ends the job's
// context, so that its waits give up.
func (w *work) OnAbort(error) {
	if w.acquire() {
		w.j.cancel()
		w.release(false)
	}
}

// jobPool keeps the jobs of completed ops for reuse. A sync.Pool: its
// fast path takes no lock, and what it keeps the collector may drop.
type jobPool struct{ p sync.Pool }

// get returns a zero job.
func (p *jobPool) get() *job {
	if j, _ := p.p.Get().(*job); j != nil {
		return j
	}
	return new(job)
}

// put clears j (so that it keeps nothing of the op alive) and keeps it.
func (p *jobPool) put(j *job) {
	*j = job{}
	p.p.Put(j)
}

// workSlab hands out the Works of small lane allreduces from chunks of
// slabWorks, allocated together: one allocation per slabWorks ops rather
// than one per op. At 2 ranks and 8 B, the Work's allocation was about a
// twentieth of the op's own CPU time (mallocgc, its assists), one call
// per op (docs/perf.md, issue 17, eighth pass). The price is that a Work
// kept keeps its chunk alive, and with it the outputs of up to
// slabWorks-1 other ops; hence small ops only (slabBytes), whose outputs
// are small tensors. The Backend's mu guards it.
//
// Works given back (work.Release) and dropped from the outstanding list
// come back through reused, first out: a blocking loop of small ops
// (the dispatcher's AllreduceWait) then allocates no Work at all.
type workSlab struct {
	free   []work
	reused []*work
}

const (
	// slabWorks is how many Works a chunk holds: a 4 KiB size class's
	// worth.
	slabWorks = 4096 / int(unsafe.Sizeof(work{}))
	// slabBytes is the largest lane allreduce (one tensor) whose Work
	// comes from the slab.
	slabBytes = 4 << 10
)

// get returns a zero Work; b.mu is held.
func (s *workSlab) get() *work {
	if n := len(s.reused); n > 0 {
		w := s.reused[n-1]
		s.reused[n-1] = nil
		s.reused = s.reused[:n-1]
		return w
	}
	if len(s.free) == 0 {
		s.free = make([]work, slabWorks)
	}
	w := &s.free[0]
	s.free = s.free[1:]
	return w
}

// recycle takes back w, given back and dropped from the outstanding
// list, cleared so that it keeps nothing of its op alive; b.mu is held.
func (s *workSlab) recycle(w *work) {
	*w = work{}
	s.reused = append(s.reused, w)
}
