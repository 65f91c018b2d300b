package nccl

import "github.com/gocoll/gocoll/cuda"

// The hand-over of launched works to the watchdog unit (b.wd, under b.mu).
// The hot path (launchOne) pushes each work on its communicator's fresh
// list (comm.fresh, one atomic operation); the fresh works reach the unit
// in launch order at the next early retirement on that communicator
// (every probeEvery launches), at the watchdog's round, and before
// anything else reads the unit (flushLocked, flushAllLocked). Other
// launches (groups, nonblocking communicators) are handed over by enqueue
// itself, after a flush of their communicator, so that the unit keeps
// each communicator's launch order.

// enqueue hands w to the watchdog (unless launchOne queued it in its
// communicator's fresh list) and releases stashes that the watchdog freed
// since the last op (on this goroutine, as PyTorch does in workEnqueue).
func (b *Backend) enqueue(w *Work) {
	if w != nil && w.sweep {
		b.enqueueSweep(w)
		return
	}
	if w != nil && w.fresh {
		if !b.unstashed.Load() {
			return // the hot path: no lock
		}
		w = nil
	}
	b.mu.Lock()
	if w != nil {
		b.flushLocked(w.c) // the unit keeps each communicator's launch order
		b.wd.Enqueue(w, w.c.key, w.enq, w.timeout)
	}
	rel := b.takeUnstashLocked()
	b.mu.Unlock()
	for _, r := range rel {
		r.Release()
	}
}

// takeUnstashLocked takes the stashes the watchdog freed. b.mu is held.
func (b *Backend) takeUnstashLocked() []cuda.Retainer {
	rel := b.unstash
	b.unstash = nil
	b.unstashed.Store(false)
	return rel
}

// flushLocked moves c's fresh works into the unit, in launch order. b.mu
// is held, so that two flushes cannot enqueue their batches out of order.
func (b *Backend) flushLocked(c *comm) {
	w := c.fresh.Swap(nil)
	if w == nil {
		return
	}
	// Newest first: reverse the links.
	var prev *Work
	for w != nil {
		next := w.freshNext
		w.freshNext = prev
		prev, w = w, next
	}
	for w = prev; w != nil; {
		next := w.freshNext
		w.freshNext = nil
		b.wd.Enqueue(w, c.key, w.enq, w.timeout)
		w = next
	}
}

// pushFresh adds w, just launched on c, to c's fresh works. c.mu is held
// (one pusher at a time; a flush may swap the list away meanwhile).
func (c *comm) pushFresh(w *Work) {
	for {
		old := c.fresh.Load()
		w.freshNext = old
		if c.fresh.CompareAndSwap(old, w) {
			return
		}
	}
}

// flushAllLocked is flushLocked for every communicator. b.mu is held.
func (b *Backend) flushAllLocked() {
	if all := b.all.Load(); all != nil {
		for _, c := range *all {
			b.flushLocked(c)
		}
	}
}

// addComm adds c to the list flushAllLocked reads, before c is published.
func (b *Backend) addComm(c *comm) {
	for {
		old := b.all.Load()
		var next []*comm
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, c)
		if b.all.CompareAndSwap(old, &next) {
			return
		}
	}
}

// enqueueSweep is enqueue after early retirement found works complete
// (w.sweep, every probeEvery launches at most): it also drops the unit's
// finished front, so that those Works die young (retire.go), and releases
// their stashes (ops never waited on) outside b.mu, as the watchdog does;
// a Wait racing for one may take it first (appendStash).
func (b *Backend) enqueueSweep(w *Work) {
	var buf [2 * ringSize]*Work
	b.mu.Lock()
	if w.fresh {
		b.flushLocked(w.c)
	} else {
		b.wd.Enqueue(w, w.c.key, w.enq, w.timeout)
	}
	swept := b.wd.RetireFront(finished, buf[:0])
	rel := b.takeUnstashLocked()
	b.mu.Unlock()
	for _, r := range rel {
		r.Release()
	}
	for _, d := range swept {
		d.releaseStash()
	}
}
