package shm

import (
	"runtime"
	"time"
)

// pacer paces the polling phase of a wait (Ring.Await and AwaitStamped,
// Board.Await): a spin of up to spin, or, with spin <= 0, polls with
// sched_yield for up to yield (ranks outnumber cores: the peer the wait
// is for may need this CPU), after which the caller sleeps on its futex.
type pacer struct {
	spin, yield time.Duration
	start       time.Time   // the first clock reading; zero until taken
	budget      *SpinBudget // where spin came from; nil: a fixed spin
	slept       bool        // the caller slept (sleeping)
}

// newPacer paces a wait: spin, or, when spin > 0 and budget is not nil,
// budget's spin, which the wait's outcome then adjusts (ended).
func newPacer(spin, yield time.Duration, budget *SpinBudget) pacer {
	if spin <= 0 || budget == nil {
		return pacer{spin: spin, yield: yield}
	}
	return pacer{spin: budget.Budget(), yield: yield, budget: budget}
}

// sleeping notes that the wait sleeps (its polling phase is over).
func (p *pacer) sleeping() { p.slept = true }

// ended tells the budget, if any, how a wait that got what it waited for
// went: only one that slept says anything (the clock has started then,
// as the polling phase ran out).
func (p *pacer) ended() {
	if p.slept && p.budget != nil {
		p.budget.Slept(time.Since(p.start))
	}
}

// poll is called after the wait's poll number i found nothing; it spins
// or yields once and reports true while the polling phase lasts, and
// false once the caller should sleep.
//
// A poll is two loads; the scheduler (Gosched) and the clock cost a
// hundred times more, so both are taken only now and then: the profile
// of a small allreduce was half Gosched. Not rarer than every 256 spins:
// the goroutine the op waits for may be in this process (two ranks of
// one process, as in BenchmarkAllreduce) and need this P; with a Gosched
// every 4096 polls that benchmark took 70-115 µs at 8 B, not 5-7. A
// yielding wait reads the clock from its 16th poll on: one whose peer
// runs within a few yields (4 ranks on 2 cores: most) reads none.
func (p *pacer) poll(i int) bool {
	if p.spin <= 0 && p.yield > 0 {
		if i&15 == 15 && p.expired(p.yield) {
			p.yield = 0
		}
		if p.yield > 0 {
			schedYield()
			return true
		}
	}
	if p.spin > 0 {
		if i&255 == 255 {
			if p.expired(p.spin) {
				p.spin = 0
			}
			runtime.Gosched()
		}
		return true
	}
	return false
}

// expired reports whether d has passed since the first call, which
// starts the clock.
func (p *pacer) expired(d time.Duration) bool {
	if p.start.IsZero() {
		p.start = time.Now()
		return false
	}
	return time.Since(p.start) > d
}
