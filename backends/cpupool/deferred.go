package cpupool

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/tensor"
)

// The deferred lane ops: a lane allreduce of one buffer of at most
// slabBytes (over the board, the flat lanes or recursive doubling, as
// laneAlgo picks) issued while nothing is queued and every lane op in
// flight is itself deferred (none queued or running) is not made a job
// and queued; the Backend keeps it in a ring of deferSlots (dq), and its
// Wait runs it, and the deferred ops issued before it, on the caller's
// goroutine with none of the job's machinery (the job and its context
// from the pool, the queue's two locks, the ticket's lock, the run's
// references). At 4 ranks on 2 cores and 8 B that machinery was about
// 0.25-0.3 µs of the op's ~1.6 µs of CPU per rank, which the CPU the
// ranks share pays three times per op (docs/perf.md, issue 17, ninth
// pass). A ring rather than one slot: a loop that keeps several ops in
// flight (conftest bench keeps up to four) finds the one op before it
// still waiting at every issue, and a single slot then sent every op to
// the queue (docs/perf.md, issue 17, tenth pass).
//
// Anything else that would run first or alongside takes them out of the
// ring (flushDeferred: each becomes a job in the queue, oldest first,
// ahead of what comes next): a push of any op (queue.push), a worker
// that finds the queue empty (queue.pop), the nudge when nobody has
// taken a job or run such an op for a period (queue.nudged), Close
// (queue.close). dq.mu guards the ring; whoever takes an op out of it
// (under dq.mu, clearing its Work's inRing) owns it.

// deferSlots is the ring's size: ops in flight that a loop may keep
// deferred. More go to the queue.
const deferSlots = 8

// deferRing holds the deferred lane ops, oldest at head.
type deferRing struct {
	mu   sync.Mutex
	ops  [deferSlots]deferredOp
	head int // the oldest op waiting
	n    int // ops waiting, from head on
	// busy counts the ops a Wait took and has not finished: they keep
	// their slots (before head) until then. An op is deferred only while
	// busy is 0, so those slots are never handed out again early.
	busy int
	// waiting is n, for the looks that take no lock.
	waiting atomic.Int32
}

// deferredOp is an op in the ring: what its run (or its job) needs.
type deferredOp struct {
	h       *work
	ctx     context.Context
	m       backend.Meta
	outputs []*tensor.Tensor
	buf     []byte
	k       reduce.Kernel
	fp      tcpmesh.Fingerprint
	tag     uint64
	ticket  uint64
	jc      jobCtx // the run's context (runDeferred)
	lo      laneOp // the run's view of the lanes
}

// deferLane is collectiveLane for a small lane allreduce of one buffer,
// with b.mu held: it reports whether the op went into the ring (then h is
// its Work and b.mu is released), or must take the queue (b.mu still
// held).
func (b *Backend) deferLane(ctx context.Context, op backend.Op, m backend.Meta, fp tcpmesh.Fingerprint, outputs []*tensor.Tensor, buf []byte, k reduce.Kernel) (*work, bool) {
	if len(buf) > slabBytes || b.q.nudge == nil || b.q.n.Load() != 0 {
		return nil, false
	}
	r := &b.dq
	r.mu.Lock()
	// Every lane op in flight waits in the ring: this one's turn comes
	// right after theirs.
	if r.busy != 0 || r.n == deferSlots || b.laneIssued-b.laneDone.Load() != uint64(r.n) {
		r.mu.Unlock()
		return nil, false
	}
	h := b.works.get()
	d := &r.ops[(r.head+r.n)%deferSlots]
	d.h, d.ctx, d.m, d.outputs, d.buf, d.k, d.fp = h, ctx, m, outputs, buf, k, fp
	d.tag = b.issued.Add(1)
	d.ticket = b.laneIssued
	b.laneIssued++
	h.b, h.op, h.timeout, h.deferred = b, op, m.Timeout, true
	if m.Timeout > 0 {
		issued := m.Issued
		if issued == 0 {
			issued = backend.Mono()
		}
		h.deadline = issued + m.Timeout
	}
	h.Init(m.Seq, b.opts.EnableTiming, h) // refs 0: no job (work.acquire fails)
	h.inRing.Store(true)
	b.trackLocked(h)
	r.n++
	r.waiting.Store(int32(r.n))
	r.mu.Unlock()
	b.mu.Unlock()
	if !m.Waited {
		// Nobody may wait: the nudge runs the op then. A blocking call
		// (Meta.Waited) runs it from its Wait right away, and the timer's
		// wake-ups, one thread each, took a core from the ranks of an
		// oversubscribed host (docs/perf.md, issue 17, twelfth pass).
		b.q.armDeferred()
	}
	return h, true
}

// takeDeferred runs w's op on this goroutine, after the deferred ops
// issued before it, if it waits in the ring, and reports whether it did.
func (b *Backend) takeDeferred(w *work) bool {
	if !w.inRing.Load() {
		return false
	}
	r := &b.dq
	r.mu.Lock()
	cnt := 0
	for i := range r.n {
		if r.ops[(r.head+i)%deferSlots].h == w {
			cnt = i + 1
			break
		}
	}
	if cnt == 0 {
		r.mu.Unlock()
		return false
	}
	start := r.head
	for i := range cnt {
		r.ops[(start+i)%deferSlots].h.inRing.Store(false)
	}
	r.head = (r.head + cnt) % deferSlots
	r.n -= cnt
	r.busy += cnt
	r.waiting.Store(int32(r.n))
	r.mu.Unlock()
	for i := range cnt {
		b.runDeferred(&r.ops[(start+i)%deferSlots])
	}
	return true
}

// awaitJob waits, for a Wait that found w's op gone from the ring, until
// it is either complete or a job (a flush gives it one within a few
// instructions); it returns at once while the op is still in the ring.
func (b *Backend) awaitJob(w *work) {
	for !w.inRing.Load() && !w.IsCompleted() && w.refs.Load() == 0 {
		runtime.Gosched()
	}
}

// runDeferred runs the op d, taken from the ring. It is runJob and
// runLane for it: it waits for its turn (a Wait on another goroutine may
// be running the ops before it), and it runs under the lanes' hold.
func (b *Backend) runDeferred(d *deferredOp) {
	h := d.h
	d.jc = jobCtx{}
	d.jc.init(d.ctx, d.m.Timeout, d.m.Issued)
	h.MarkStarted()
	err := b.laneTurn(&d.jc, d.ticket)
	turned := err == nil // else laneTurn gave the turn up
	if turned {
		b.mesh.HoldLanes()
		d.lo = laneOp{b: b, tag: d.tag, fp: d.fp}
		if d.k.Pre != nil {
			d.k.Pre(d.buf)
		}
		err = b.laneAlgo(&d.jc, &d.lo, d.buf, d.k)
		if err == nil {
			b.post(d.k, d.buf, b.cfg.WorldSize)
		}
		b.mesh.ReleaseLanes()
	}
	if err != nil {
		// As runJob's: a job is made for the error's words only.
		// Its context is its own (the ring slot's is reused): how the run's
		// ended, carried over.
		j := &job{op: h.op, seq: d.m.Seq, tag: d.tag, peer: -1, timeout: d.m.Timeout, h: h, w: &h.HostWork, lane: true, fp: d.fp}
		j.jc.init(d.ctx, d.m.Timeout, d.m.Issued)
		_ = d.jc.Err() // an expired deadline is recorded in its state
		j.jc.state.Store(d.jc.state.Load())
		j.ctx = &j.jc
		raw := err
		err = b.wrap(j, err)
		if code, peer, ok := mismatchOf(raw); ok {
			b.mesh.FailTag(d.tag, code, peer, errors.New(detailOf(err)))
		}
	}
	outputs := d.outputs
	d.jc.cancel() // its timer, if a Done made one
	*d = deferredOp{}
	b.dRuns.Add(1)
	if turned {
		b.laneEnd()
	}
	b.dq.mu.Lock()
	b.dq.busy--
	b.dq.mu.Unlock()
	b.ended.Add(1)
	h.Complete(outputs, err)
	// A flush may have queued the ops behind this one while it ran, and
	// the Waits for them, finding their turn not come, left them to the
	// goroutine running the op before (help): this one, which returns to
	// its caller, so a worker takes them.
	b.q.kickReady()
}

// flushDeferred makes the oldest op waiting in the ring, if any, a job
// and returns it for the caller to queue ahead of what it queues; q.mu is
// held. Called until it returns nil, it empties the ring in issue order.
func (b *Backend) flushDeferred() *job {
	r := &b.dq
	if r.waiting.Load() == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		return nil
	}
	d := &r.ops[r.head]
	h := d.h
	h.inRing.Store(false)
	j := b.jobs.get()
	j.op, j.seq, j.peer, j.timeout, j.outputs = h.op, d.m.Seq, -1, d.m.Timeout, d.outputs
	j.jc.init(d.ctx, d.m.Timeout, d.m.Issued)
	j.ctx = &j.jc
	j.lane, j.fp, j.k = true, d.fp, d.k
	j.bufs = append(j.buf1[:0], d.buf)
	j.tag, j.ticket = d.tag, d.ticket
	j.h, j.w = h, &h.HostWork
	h.j = j
	h.refs.Store(1) // the run's; publishes h.j to acquire
	*d = deferredOp{}
	r.head = (r.head + 1) % deferSlots
	r.n--
	r.waiting.Store(int32(r.n))
	return j
}
