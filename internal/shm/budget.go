package shm

import (
	"sync/atomic"
	"time"
)

// SpinBudget is how long a rank's waits on its shared-memory peers spin
// before they sleep (Board.Budget, Ring.Budget), adapted to the waits'
// own outcomes as Linux KVM's halt polling adapts its poll: a wait that
// slept and was woken soon after (within the budget's ceiling) doubles
// it, since a longer spin would have caught the peer; a wait that slept
// longer than the ceiling sets it back to its floor, since the peer was
// busy elsewhere and spinning for it would only have burnt the core.
//
// Why: a sleeping rank's wake-up costs more than a short spin, and most
// of all on a virtual machine, where the sleeper's idle virtual CPU
// halts and the host must run it again. On the dev machine that took 60
// to 150 µs; a 2-rank 8 B allreduce whose ranks had once fallen out of
// step then slept in turn on every op (each woken after the other's 50
// µs spin had run out), and ran at 15 µs per op for the rest of the
// run rather than 1 (docs/perf.md, issue 17, seventeenth pass).
//
// Its methods may be called concurrently.
type SpinBudget struct {
	floor, ceil time.Duration
	cur         atomic.Int64 // the budget, in nanoseconds
}

// NewSpinBudget returns a budget that starts at floor and grows to at
// most ceil (at least floor).
func NewSpinBudget(floor, ceil time.Duration) *SpinBudget {
	s := &SpinBudget{floor: floor, ceil: max(ceil, floor)}
	s.cur.Store(int64(floor))
	return s
}

// Budget is how long the next wait spins.
func (s *SpinBudget) Budget() time.Duration { return time.Duration(s.cur.Load()) }

// Slept records a wait that slept and ended d after it began to poll:
// within the ceiling, the budget becomes twice the greater of itself and
// d (at most the ceiling); beyond it, the floor.
func (s *SpinBudget) Slept(d time.Duration) {
	if d > s.ceil {
		s.cur.Store(int64(s.floor))
		return
	}
	s.cur.Store(int64(min(s.ceil, 2*max(s.Budget(), d))))
}
