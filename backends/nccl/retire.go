package nccl

import "github.com/gocoll/gocoll/cuda"

// Early retirement on the issue path. The end events of completed works go
// back to the pool only once something sees them complete: the watchdog,
// every WatchdogInterval (100 ms), or a caller's query. A loop that issues
// an op every couple of microseconds has tens of thousands of works
// between two watchdog rounds, so each op records a different, cold end
// event out of a pool of that size, and the Works stay live for the GC to
// scan. Every probeEvery launches the issuing goroutine queries the end
// event of the work launched probeLag launches before, if it is on the
// same stream; once that one is complete, every work of the ring launched
// before it on that stream is too (a stream runs its work in order, the
// watchdog's rule), and they complete without a query of their own, their
// events back in the pool in one hand-over. One query per probeEvery ops.
// After such a probe the issuing goroutine also drops the finished works
// at the front of the watchdog unit's list (watch.RetireFront) and
// releases their stashes: otherwise every Work stayed live until the
// watchdog's next round (a loop issuing every couple of microseconds kept
// ~50 k of them, and each op's allocation came from fresh spans the GC
// then scanned: with GOGC=off the backend was 490 ns per op over the same
// calls from a bare Go loop, against 770 with the GC on,
// BenchmarkIssueCrossing on nvidia-h200, nccl16b r1; after this change
// 592 against 713 at the median, r2). The watchdog still sees every work
// that is not finished.

const (
	ringSize   = 64 // works remembered per communicator, by launch number
	probeEvery = 32 // launches between two probes
	probeLag   = 32 // how far behind the newest launch the probed work is
)

// remember notes w, just launched on c with its end event recorded and
// not captured, in c's ring. c.mu is held.
func (c *comm) remember(w *Work) {
	c.recent[w.lseq%ringSize] = w
}

// probeFor returns the work to probe after launching w, if this launch is
// a probing one and that work is on w's stream. c.mu is held.
func (c *comm) probeFor(w *Work) *Work {
	if w.lseq%probeEvery != 0 || w.lseq <= probeLag {
		return nil
	}
	p := c.recent[(w.lseq-probeLag)%ringSize]
	if p == nil || p.lseq != w.lseq-probeLag || p.stream != w.stream || p.lseq <= c.probedTo {
		return nil
	}
	return p
}

// retireBefore probes p, outside c.mu; if it is complete, it completes
// every work of c's ring launched after the last probe and before p on
// p's stream, and reports true: the watchdog unit's oldest works may now
// be finished (Backend.enqueue drops them).
func (c *comm) retireBefore(p *Work) bool {
	if !p.poll() || !p.isDone() {
		return false
	}
	var buf [ringSize]*Work
	olds := buf[:0]
	c.mu.Lock()
	from := c.probedTo
	if p.lseq > c.probedTo {
		c.probedTo = p.lseq
	}
	for _, q := range c.recent {
		if q != nil && q.lseq > from && q.lseq < p.lseq && q.stream == p.stream {
			olds = append(olds, q)
		}
	}
	c.mu.Unlock()
	var ebuf [2 * ringSize]*cuda.Event
	evs := ebuf[:0]
	for _, q := range olds {
		if !q.isFinished() {
			evs = q.completeInOrderTo(evs)
		}
	}
	if len(evs) > 0 {
		c.putEvents(evs...)
	}
	return true
}
