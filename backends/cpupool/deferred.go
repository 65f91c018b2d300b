package cpupool

import (
	"context"
	"errors"
	"runtime"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/reduce"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/tensor"
)

// The deferred lane op: a lane allreduce of one buffer of at most
// slabBytes (over the board, the flat lanes or recursive doubling, as
// laneAlgo picks) issued while nothing else is queued and no lane op is
// in flight is not made a job and queued; the Backend keeps it in one slot
// (dOp), and its Wait runs it on the caller's goroutine with none of the
// job's machinery (the job and its context from the pool, the queue's two
// locks, the ticket's turn and its lock, the run's references). At 4
// ranks on 2 cores and 8 B that machinery was about 0.25-0.3 µs of the
// op's ~1.6 µs of CPU per rank, which the CPU the ranks share pays three
// times per op (docs/perf.md, issue 17, ninth pass). At 2 ranks, in a
// loop that waits for each op before the next (MPI_Allreduce's), it took
// 8 B from 1.44-1.50 to 1.24-1.36 µs (docs/perf.md, issue 17, tenth pass).
//
// Anything else that would run first or alongside takes it out of the
// slot (flushDeferred: it becomes a job in the queue, ahead of what comes
// next, in its issue order): a push of any op (queue.push), a worker that
// finds the queue empty (queue.pop), the nudge when nobody has taken a
// job or run such an op for a period (queue.nudged), Close (queue.close).
// dW holds the op's Work while it waits in the slot; whoever swaps it out
// owns the op, and frees the slot (dBusy) once done with its fields.

// deferredOp is the op in the slot: what its run (or its job) needs.
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
// with b.mu held: it reports whether the op went into the slot (then h is
// its Work and b.mu is released), or must take the queue (b.mu still
// held). The slot is free (dBusy) once whoever took its last op is done
// with it.
func (b *Backend) deferLane(ctx context.Context, op backend.Op, m backend.Meta, fp tcpmesh.Fingerprint, outputs []*tensor.Tensor, buf []byte, k reduce.Kernel) (*work, bool) {
	if len(buf) > slabBytes || b.q.nudge == nil || b.q.n.Load() != 0 || b.laneDone.Load() != b.laneIssued ||
		!b.dBusy.CompareAndSwap(false, true) {
		return nil, false
	}
	h := b.works.get()
	d := &b.dOp
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
	h.Init(m.Seq, true, h) // refs 0: no job (work.acquire fails)
	b.trackLocked(h)
	b.dW.Store(h) // publishes the slot: whoever swaps it out owns the op
	b.mu.Unlock()
	b.q.armDeferred()
	return h, true
}

// takeDeferred runs w's op on this goroutine if it is in the slot, and
// reports whether it did.
func (b *Backend) takeDeferred(w *work) bool {
	if b.dW.Load() != w || !b.dW.CompareAndSwap(w, nil) {
		return false
	}
	b.runDeferred()
	return true
}

// awaitJob waits, for a Wait that found w's op gone from the slot, until
// it is either complete or a job (a flush gives it one within a few
// instructions); it returns at once while the op is still in the slot.
func (b *Backend) awaitJob(w *work) {
	for b.dW.Load() != w && !w.IsCompleted() && w.refs.Load() == 0 {
		runtime.Gosched()
	}
}

// runDeferred runs the op taken from the slot. It is runJob and runLane
// for it: its turn is now (no lane op was in flight or queued at its
// issue, and every later one waits for it), and it runs under the lanes'
// hold.
func (b *Backend) runDeferred() {
	d := &b.dOp
	h := d.h
	d.jc = jobCtx{}
	d.jc.init(d.ctx, d.m.Timeout, d.m.Issued)
	h.MarkStarted()
	b.mesh.HoldLanes()
	d.lo = laneOp{b: b, tag: d.tag, fp: d.fp}
	if d.k.Pre != nil {
		d.k.Pre(d.buf)
	}
	err := b.laneAlgo(&d.jc, &d.lo, d.buf, d.k)
	if err == nil {
		b.post(d.k, d.buf, b.cfg.WorldSize)
	}
	b.mesh.ReleaseLanes()
	if err != nil {
		// As runJob's: a job is made for the error's words only.
		// Its context is its own (the slot's is reused): how the run's
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
	b.laneEnd()
	b.dBusy.Store(false)
	h.Complete(outputs, err)
}

// flushDeferred makes the op in the slot, if nobody has taken it, a job
// and returns it for the caller to queue ahead of what it queues; q.mu is
// held.
func (b *Backend) flushDeferred() *job {
	h := b.dW.Load()
	if h == nil || !b.dW.CompareAndSwap(h, nil) {
		return nil
	}
	d := &b.dOp
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
	b.dBusy.Store(false)
	return j
}
