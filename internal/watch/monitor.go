package watch

import (
	"fmt"
	"time"
)

// MonitorExitCode is the status the heartbeat monitor ends the process
// with: 128 + SIGABRT, as PyTorch's monitor ends with abort().
const MonitorExitCode = 134

// Heartbeat is the heartbeat monitor's decision (PyTorch's
// HeartbeatMonitor): each backend's watchdog counts its rounds, the
// monitor feeds the counts with the time, and a count that has not moved
// for the timeout ends the process, after a dump of the flight recorder
// and of every goroutine's stack. K names a backend.
type Heartbeat[K comparable] struct {
	timeout time.Duration
	last    map[K]uint64
	moved   map[K]time.Time
	fired   bool
}

// NewHeartbeat returns a monitor that fires after timeout without a beat.
func NewHeartbeat[K comparable](timeout time.Duration) *Heartbeat[K] {
	return &Heartbeat[K]{timeout: timeout, last: map[K]uint64{}, moved: map[K]time.Time{}}
}

// Observe feeds backend k's count at now; name names the backend in the
// reason. A count seen for the first time, or changed, restarts k's clock.
// When it stood still for the timeout, Observe returns the dump, the
// stacks, the fatal line and the exit (MonitorExitCode), once; after that
// it returns nothing, since the process is ending.
func (h *Heartbeat[K]) Observe(now time.Time, k K, name string, beat uint64) []Action[K] {
	if h.fired {
		return nil
	}
	if prev, ok := h.last[k]; !ok || prev != beat {
		h.last[k], h.moved[k] = beat, now
		return nil
	}
	stuck := now.Sub(h.moved[k])
	if stuck < h.timeout {
		return nil
	}
	h.fired = true
	reason := fmt.Sprintf("watchdog heartbeat of backend %s has not moved for %v (heartbeat timeout %v)",
		name, stuck.Round(time.Millisecond), h.timeout)
	return []Action[K]{
		{Kind: Dump, Reason: "heartbeat monitor: " + reason},
		{Kind: Stacks},
		{Kind: Fatal, Reason: reason},
		{Kind: Exit, Code: MonitorExitCode},
	}
}

// Fired reports whether the monitor has decided to end the process.
func (h *Heartbeat[K]) Fired() bool { return h.fired }

// Dumps is the flight recorder's dump decisions, other than on demand:
// the first failed op dumps (unless NoDumpOnError), and each distinct
// dump signal a peer posts through the store dumps once; this rank's own
// signal (it dumped before posting it) does not.
type Dumps struct {
	// NoDumpOnError turns off the dump on the first failed op.
	NoDumpOnError bool

	erred bool   // an op failed (and was dumped for, unless turned off)
	seen  string // the dump signal answered last
}

// Error feeds an op's failure (its error text): the first one dumps.
func (d *Dumps) Error(msg string) []Action[struct{}] {
	if d.NoDumpOnError || d.erred {
		return nil
	}
	d.erred = true
	return []Action[struct{}]{{Kind: Dump, Reason: "error: " + msg}}
}

// PeerSignal feeds the dump signal found in the store: a new one dumps.
func (d *Dumps) PeerSignal(v string) []Action[struct{}] {
	if v == d.seen {
		return nil
	}
	d.seen = v
	return []Action[struct{}]{{Kind: Dump, Reason: "peer asked: " + v}}
}

// OwnSignal notes the signal this rank posts after dumping, so that
// reading it back does not dump again.
func (d *Dumps) OwnSignal(v string) { d.seen = v }
