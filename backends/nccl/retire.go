package nccl

import "github.com/gocoll/gocoll/cuda"

// Early retirement on the issue path. The end events of completed works go
// back to the pool only once something sees them complete: the watchdog,
// every WatchdogInterval (100 ms), or a caller's query. A loop that issues
// an op every couple of microseconds has tens of thousands of works
// between two watchdog rounds, so each op would record a different, cold
// end event out of a pool of that size, and the Works would stay live for
// the GC to scan (with GOGC=off the backend was 490 ns per op over the
// same calls from a bare Go loop, against 770 with the GC on,
// BenchmarkIssueCrossing on nvidia-h200, nccl16b r1).
//
// So the hot path's works (launchOne: issued, end event recorded, not
// captured) are staged on their way to the watchdog unit. launchOne pushes
// each on its communicator's fresh list (comm.fresh, one atomic
// operation). Every probeEvery launches the issuing goroutine stages that
// batch (comm.staged) and looks at the batch staged the time before: it
// queries the end event of that batch's newest work, and if it is
// complete, every work of the batch on the same stream is too (a stream
// runs its work in order, the watchdog's rule): they complete without a
// query of their own, their events go back to the pool in one hand-over,
// their stashes are released, and they never enter the unit, which has
// nothing to watch in them. Works of the batch on other streams, and the
// whole batch when its newest work is still running, go to the unit in
// launch order. One query per probeEvery ops, and per work one
// compare-and-swap of its state (completeInOrderTo: the state word owns
// the end event, so no lock; session 6) where the ring this replaced scanned 64
// recent works under c.mu, then put each work into the unit and took it
// out again (session 5: that path was ~11 % of the goal mode's samples,
// the largest item of the backend's Go).
//
// The watchdog still sees every work that is not finished: its round, and
// anything else that reads the unit, moves the staged and fresh works in
// first (Backend.flushLocked), so a batch waits for the unit at most until
// the next round.

const probeEvery = 32 // launches between two probes

// retireStaged is the probe of a probing launch on c, on the issuing
// goroutine after c.mu is released: it stages c's fresh works and retires
// the batch staged before them if its newest work is complete, or hands
// that batch to the unit.
func (b *Backend) retireStaged(c *comm) {
	b.mu.Lock()
	p := c.staged
	b.mu.Unlock()
	// The query, outside every lock (a cgo call of ~0.2-0.4 us); p stays
	// staged meanwhile, so that a watchdog round that comes first moves it
	// into the unit in launch order, and the check below then sees it gone.
	done := p != nil && p.poll() && p.isDone()
	var buf [2 * probeEvery]*Work
	var same []*Work
	b.mu.Lock()
	if c.staged == p {
		prev := listOldestFirst(p, buf[:0])
		c.staged = c.fresh.Swap(nil)
		same = prev[:0]
		for _, q := range prev {
			if done && q.stream == p.stream {
				same = append(same, q) // complete: p ran after it on its stream
				continue
			}
			b.wd.Enqueue(q, c.key, q.enqTime(), q.timeout)
		}
	}
	b.mu.Unlock()
	if len(same) == 0 {
		return
	}
	// Outside b.mu: completing a work runs its future's callbacks, which
	// may issue ops. These works are in no list now, and all complete.
	var ebuf [4 * probeEvery]*cuda.Event
	evs := ebuf[:0]
	for _, q := range same {
		if !q.isFinished() {
			evs = q.completeInOrderTo(evs)
		}
		q.releaseStash() // an op never waited on
	}
	if len(evs) > 0 {
		c.putEvents(evs...)
	}
}

// listOldestFirst appends the works of the list that starts at head (the
// newest, linked by freshNext to older ones) to dst, oldest first, and
// unlinks them. The caller owns the list (it took it from comm.fresh or
// comm.staged under b.mu).
func listOldestFirst(head *Work, dst []*Work) []*Work {
	n0 := len(dst)
	for w := head; w != nil; {
		next := w.freshNext
		w.freshNext = nil
		dst = append(dst, w)
		w = next
	}
	for i, j := n0, len(dst)-1; i < j; i, j = i+1, j-1 {
		dst[i], dst[j] = dst[j], dst[i]
	}
	return dst
}
