package cpupool

import "github.com/gocoll/gocoll/backend"

// SetFlatLanes turns the flat lane allreduce (flatFor) on or off for b,
// whatever the host's cores: the tests run both algorithms everywhere.
func SetFlatLanes(b backend.Backend, on bool) { b.(*Backend).flat = on }

// HasBoard reports whether b's flat lane allreduces post on a board.
func HasBoard(b backend.Backend) bool { return b.(*Backend).board }

// DeferredRuns is how many ops b's Waits ran from its deferred slot.
func DeferredRuns(b backend.Backend) uint64 { return b.(*Backend).dRuns.Load() }

// Probe is b's answer to a peer's probe: the collectives it issued, and
// whether one of them has not ended.
func Probe(b backend.Backend) (issued uint64, busy bool) {
	v := b.(*Backend).probeValue()
	return v &^ probeBusy, v&probeBusy != 0
}

// NudgeArmed reports whether b's nudge timer is set.
func NudgeArmed(b backend.Backend) bool { return b.(*Backend).q.armedA.Load() }
