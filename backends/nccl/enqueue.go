package nccl

import "github.com/gocoll/gocoll/cuda"

// The hand-over of launched works to the watchdog unit (b.wd, under b.mu).
// The hot path (launchOne) pushes each work on its communicator's fresh
// list (comm.fresh, one atomic operation); the fresh works are staged at
// the next probe on that communicator (every probeEvery launches), and
// reach the unit in launch order from there, unless the probe after
// retires them (retire.go), at the watchdog's round, and before anything
// else reads the unit (flushLocked, flushAllLocked). Other
// launches (groups, nonblocking communicators) are handed over by enqueue
// itself, after a flush of their communicator, so that the unit keeps
// each communicator's launch order.

// enqueue hands w to the watchdog (unless launchOne queued it in its
// communicator's fresh list) and releases stashes that the watchdog freed
// since the last op (on this goroutine, as PyTorch does in workEnqueue).
func (b *Backend) enqueue(w *Work) {
	if w != nil && w.fresh {
		if !b.unstashed.Load() {
			return // the hot path: no lock
		}
		w = nil
	}
	b.mu.Lock()
	if w != nil {
		b.flushLocked(w.c) // the unit keeps each communicator's launch order
		b.wd.Enqueue(w, w.c.key, w.enqTime(), w.timeout)
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

// flushLocked moves c's staged works, then its fresh ones, into the unit,
// in launch order. b.mu is held, so that two flushes cannot enqueue their
// batches out of order.
func (b *Backend) flushLocked(c *comm) {
	staged := c.staged
	c.staged = nil
	fresh := c.fresh.Swap(nil)
	if staged == nil && fresh == nil {
		return
	}
	var buf [4 * probeEvery]*Work
	ws := listOldestFirst(staged, buf[:0])
	ws = listOldestFirst(fresh, ws)
	for _, w := range ws {
		b.wd.Enqueue(w, c.key, w.enqTime(), w.timeout)
	}
	clear(ws)
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
