package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"math"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/tensor"
)

// The launch path. Every op builds its NCCL calls and hands them to submit
// (p2p and barrier pick their communicator first and call launch, as does
// EndCoalescing); launch is the one place that makes a Work, orders the
// streams, issues the calls, stashes the tensors and hands the Work to the
// watchdog. A single call with elements takes the hot path: one cgo
// crossing (gn_issue), and no Go allocation but the Work. Anything else is
// one NCCL group on a locked OS thread.

// noTimeout is what a Work compares against when its op has no timeout
// (Meta.Timeout 0, from a caller that bypasses the dispatcher).
const noTimeout = time.Duration(math.MaxInt64)

// issuedAt is op m's start, the origin of its timeout, on the
// backend.Mono clock: the dispatcher's reading when it made one
// (Meta.Issued), else the clock now (one read: time.Now makes two, wall
// and monotonic, ~100 ns per op on the GPU machine, pprof of hostcost).
// The dispatcher reads it a few hundred nanoseconds before the launch; a
// timeout then counts from a little earlier, which changes nothing a
// caller can see. A Work keeps it as a Mono reading, not a time.Time (24
// bytes with a pointer the GC would see on every store): it is only ever
// subtracted from other times (timeouts, elapsed times).
func issuedAt(m backend.Meta) time.Duration {
	if m.Issued != 0 {
		return m.Issued
	}
	return backend.Mono()
}

// opTimeout returns the timeout of op m, which the dispatcher resolved
// (the op's option, else the group's default). Zero means none.
func opTimeout(m backend.Meta) time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return noTimeout
}

func (b *Backend) opError(m backend.Meta, kind error, err error) error {
	return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: b.rank, Backend: Name, Kind: kind, Err: err}
}

// wrapErr turns an internal error into an *OpError for op m.
func (b *Backend) wrapErr(m backend.Meta, err error) error {
	if err == nil {
		return nil
	}
	if oe, ok := err.(*backend.OpError); ok {
		if oe.Seq == 0 {
			oe.Seq = m.Seq
		}
		if oe.Op == "" || oe.Op == "init" {
			oe.Op = m.Op.String()
		}
		oe.Rank = b.rank
		return oe
	}
	kind := backend.ErrAborted
	for _, k := range []error{backend.ErrUnsupported, backend.ErrInvalidArgument, backend.ErrUnavailable, backend.ErrTimeout} {
		if errorsIs(err, k) {
			kind = k
		}
	}
	return b.opError(m, kind, err)
}

// devOf is the CUDA device of an op's tensors. The dispatcher has checked
// that they are contiguous CUDA tensors on one device; t is any of them.
func devOf(t *tensor.Tensor) int { return t.Device().Index }

// loadComm returns device dev's communicator if it exists: the lookup of
// the hot path, without getComm's call.
func (b *Backend) loadComm(dev int) *comm {
	if uint(dev) < maxDevices {
		return b.devComms[dev].Load()
	}
	return nil
}

// submit routes an op's calls on device dev: queued while coalescing, else
// launched on the device's communicator.
func (b *Backend) submit(ctx context.Context, m backend.Meta, dev int, async bool, ins, outs []*tensor.Tensor, calls []call) (backend.Work, error) {
	o := opLaunch{m: m, async: async, ins: ins, outs: outs}
	return b.submitOp(ctx, dev, &o, calls)
}

// submitOp is submit with the op's description in o (its stream unset),
// which the hot path (Allreduce) builds on its stack and passes down by
// pointer: the chain of calls to launchOne then passes a few words in
// registers where it copied ~17 words at each level (callgrind: ~0.4k of
// the ~2.4k instructions of the backend's call went to those levels).
func (b *Backend) submitOp(ctx context.Context, dev int, o *opLaunch, calls []call) (backend.Work, error) {
	if b.coalescing.Load() {
		return nil, b.queue(ctx, o.m, dev, o.async, o.ins, o.outs, calls)
	}
	c := b.loadComm(dev)
	if c == nil {
		var err error
		if c, err = b.getComm(ctx, dev); err != nil {
			return nil, b.wrapErr(o.m, err)
		}
	}
	w, err := b.launchOp(ctx, c, o, calls)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// launch issues calls on c as one op with one Work, one sync event and one
// end event. In sync mode the calls run on ctx's current stream; in async
// mode on c's internal stream, which first waits on the current stream
// through the sync event, and the tensors are stashed until Wait. With
// Options.AsyncOnCurrentStream an async op runs on the current stream
// too, with no sync event (stream order does its work), and keeps the
// rest of async mode: the stash, and Wait's ordering of another stream.
//
// Calls with a count of 0 never reach NCCL, as PyTorch's all2all skips
// them: every rank has the same count for a collective, and a send/recv
// pair has the same count on both sides, so every rank skips alike. In the
// conftest world-2 run on NCCL 2.28.3, the first grouped send/recv (an
// uneven list alltoall) after an ncclAlltoAll of count 0 on the same
// communicator never completed, while the same alltoall on a fresh
// communicator did. So a lone call of count 0 takes the group path, which
// gives the op its events and Work without a call.
func (b *Backend) launch(ctx context.Context, m backend.Meta, c *comm, async bool, ins, outs []*tensor.Tensor, calls []call) (*Work, error) {
	o := opLaunch{m: m, async: async, ins: ins, outs: outs}
	return b.launchOp(ctx, c, &o, calls)
}

// launchOp is launch with the op's description in o (submitOp); it sets
// o.stream.
func (b *Backend) launchOp(ctx context.Context, c *comm, o *opLaunch, calls []call) (*Work, error) {
	m := &o.m
	if err := b.usable(m.Op); err != nil {
		return nil, err
	}
	cur := cuda.StreamFor(ctx, c.dev)
	if c.nan != nil {
		if err := b.checkNaN(ctx, *m, c, cur, calls); err != nil {
			return nil, err
		}
	}
	o.stream = cur
	syncEv := uintptr(0)
	if o.async && !b.opts.AsyncOnCurrentStream {
		o.stream = c.stream
		// The sync event orders the internal stream after the current
		// one; when the caller made the internal stream current (a Work's
		// Stream()), stream order already does, and the record and wait
		// (~0.2-0.4 us each, BenchmarkDriverCalls) would be a no-op.
		if cur != c.stream {
			syncEv = c.syncEv.Handle()
		}
	}
	var w *Work
	var captured bool
	var err error
	if len(calls) == 1 && calls[0].count > 0 {
		w, captured, err = b.launchOne(ctx, c, o, cur, syncEv, &calls[0])
	} else {
		w, captured, err = b.launchGroup(ctx, c, o, cur, syncEv, calls)
	}
	if err != nil {
		if w != nil {
			// Nothing was queued that needs the tensors kept (as before
			// the stash moved into newWork, when a failed launch stashed
			// nothing).
			w.releaseStash()
		}
		return nil, b.wrapErr(*m, err)
	}
	if captured {
		// Captured into a graph: nothing ran, so the watchdog must not
		// watch it (ProcessGroupNCCL skips workEnqueue the same way).
		b.enqueueCaptured(w)
		return w, nil
	}
	b.enqueue(w)
	return w, nil
}

// opLaunch is what launch passes launchOne and launchGroup to make the
// op's Work from (newWork).
type opLaunch struct {
	m         backend.Meta
	async     bool
	ins, outs []*tensor.Tensor
	stream    *cuda.Stream // the stream the kernel goes on
}

// workSlab is how many Works newWork allocates at once: one allocation
// per workSlab ops rather than one per op (~70 ns of a ~1.3 us op in the
// issuing goroutine's profile on nvidia-h200, most of it fresh spans and
// their zeroing). Each Work is still its own op's, never reused, so a
// handle the caller keeps means what it always did; the cost is that a
// kept Work keeps its slab's host memory (workSlab Works, 4.5 KB, and what
// they point to: the ops' streams and output tensors' headers, never
// device memory, whose frees are explicit) until it is dropped.
const workSlab = 32

// newWork returns a new Work for op o on c, from c's slab. c.mu is held.
func (b *Backend) newWork(c *comm, o *opLaunch) *Work {
	if len(c.works) == 0 {
		c.works = make([]Work, workSlab)
	}
	w := &c.works[0]
	c.works = c.works[1:]
	w.b, w.c, w.op, w.seq, w.timeout = b, c, o.m.Op, o.m.Seq, opTimeout(o.m)
	w.enq, w.async, w.timing, w.stream = issuedAt(o.m), o.async, b.opts.EnableTiming, o.stream
	if len(o.outs) > 0 {
		w.issue().outputs = o.outs
	}
	if o.async && !b.test.DisableStash {
		// Before the work can reach the watchdog (launchOne's fresh
		// list), which may free the stash of a completed work.
		w.stashTensors(o.ins)
		w.stashTensors(o.outs)
	}
	return w
}

// launchOne is the hot path: one cgo crossing (gn_issue) records the sync
// event, makes the internal stream wait, records the start event, calls
// NCCL and records the end event. It returns the op's Work and whether cur
// is being captured.
func (b *Backend) launchOne(ctx context.Context, c *comm, o *opLaunch, cur *cuda.Stream, syncEv uintptr, k *call) (*Work, bool, error) {
	c.mu.Lock()
	w := b.newWork(c, o)
	end, err := c.event(w.timing) // cuEventElapsedTime needs both ends timed
	if err == nil && w.timing {
		w.issue().start, err = c.event(true)
	}
	if err != nil {
		c.mu.Unlock()
		return w, false, err
	}
	w.end = end
	c.launches++
	w.lseq = c.launches
	r := C.gn_issue(C.uintptr_t(c.ctx), C.uintptr_t(c.handle), C.uintptr_t(w.stream.Handle()), C.uintptr_t(cur.Handle()),
		C.uintptr_t(syncEv), C.uintptr_t(eventHandle(w.startEv())), C.uintptr_t(end.Handle()), k.kind,
		C.uintptr_t(k.send), C.uintptr_t(k.recv), C.size_t(k.count), k.dt, k.op, C.uint64_t(k.scalar), C.int(k.root))
	probe := false
	if r == 0 && !c.nb {
		// Issued, its end event recorded, not captured: it goes to the
		// watchdog through c's fresh list and staging, where early
		// retirement may complete it (retire.go).
		w.fresh = true
		c.pushFresh(w)
		probe = w.lseq%probeEvery == 0
	}
	c.mu.Unlock()
	if err := result(opCallName(k.kind), r); err != nil {
		return w, false, err
	}
	if probe {
		b.retireStaged(c)
	}
	if r&^C.GN_CAPTURING == ncclInProgress {
		// Nonblocking communicator: the launch finishes in the background;
		// record the end event only once it has.
		if err := c.waitReady(ctx, opCallName(k.kind), w.timeout); err != nil {
			return w, false, err
		}
		if err := result("cuEventRecord", C.gn_post(C.uintptr_t(c.ctx), C.uintptr_t(w.stream.Handle()), C.uintptr_t(end.Handle()))); err != nil {
			return w, false, err
		}
	}
	return w, r&C.GN_CAPTURING != 0, nil
}

// launchGroup runs calls as one NCCL group (collectiveCoalesced) on one
// locked OS thread, since NCCL's group state is thread-local. It returns
// the op's Work and whether cur is being captured.
func (b *Backend) launchGroup(ctx context.Context, c *comm, o *opLaunch, cur *cuda.Stream, syncEv uintptr, calls []call) (*Work, bool, error) {
	unlock := lockThread()
	defer unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	w := b.newWork(c, o)
	captured, err := b.groupCalls(ctx, c, w, cur, syncEv, calls)
	return w, captured, err
}

// groupCalls is launchGroup's body, with w made. c.mu is held.
func (b *Backend) groupCalls(ctx context.Context, c *comm, w *Work, cur *cuda.Stream, syncEv uintptr, calls []call) (bool, error) {
	end, err := c.event(w.timing)
	if err != nil {
		return false, err
	}
	w.end = end
	if w.timing {
		if w.issue().start, err = c.event(true); err != nil {
			return false, err
		}
	}
	c.launches++
	w.lseq = c.launches
	nstream := C.uintptr_t(w.stream.Handle())
	r := C.gn_pre(C.uintptr_t(c.ctx), nstream, C.uintptr_t(cur.Handle()), C.uintptr_t(syncEv), C.uintptr_t(eventHandle(w.startEv())))
	captured := r&C.GN_CAPTURING != 0
	if err := result("cuEventRecord", r); err != nil {
		return false, err
	}
	if err := result("ncclGroupStart", C.gn_group_start()); err != nil {
		return false, err
	}
	var callErr error
	for _, k := range calls {
		if k.count == 0 {
			continue
		}
		r := C.gn_issue_nosync(C.uintptr_t(c.handle), nstream, k.kind, C.uintptr_t(k.send), C.uintptr_t(k.recv),
			C.size_t(k.count), k.dt, k.op, C.uint64_t(k.scalar), C.int(k.root))
		if callErr = result(opCallName(k.kind), r); callErr != nil {
			break
		}
	}
	r = C.gn_group_end()
	if callErr != nil {
		return false, callErr
	}
	if err := result("ncclGroupEnd", r); err != nil {
		return false, err
	}
	if r == ncclInProgress {
		if err := c.waitReady(ctx, "ncclGroupEnd", w.timeout); err != nil {
			return false, err
		}
	}
	if err := result("cuEventRecord", C.gn_post(C.uintptr_t(c.ctx), nstream, C.uintptr_t(w.end.Handle()))); err != nil {
		return false, err
	}
	return captured, nil
}

func eventHandle(e *cuda.Event) uintptr {
	if e == nil {
		return 0
	}
	return e.Handle()
}
