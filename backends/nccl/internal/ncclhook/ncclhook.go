// Package ncclhook holds the nccl backend's test-only knobs, kept out of
// its public API: being internal to backends/nccl, only the backend, its
// tests and its conformance package (backends/nccl/ncclconform) can set
// them. A knob is attached to an options value, so that it reaches every
// backend made from it, through the dispatcher's BackendOptions as well as
// nccl.New, without a field in nccl.Options.
package ncclhook

import "sync"

// Knobs are the test-only settings of an nccl backend. The zero value is
// the production behaviour.
type Knobs struct {
	// DisableStash turns off keeping async ops' tensors alive until Wait,
	// for the tests that show why the stash exists: freeing an input early
	// then corrupts the op.
	DisableStash bool
	// HangWatchdog makes the watchdog stop advancing (it blocks until
	// Close), so that the heartbeat monitor fires.
	HangWatchdog bool
	// ForceScalableInit makes communicator init use
	// ncclCommInitRankScalable whatever the world size, so that one GPU
	// tests that path.
	ForceScalableInit bool
}

var (
	mu    sync.Mutex
	knobs = map[any]Knobs{}
)

// Set attaches k to opts, a *nccl.Options: every backend made with that
// pointer as its options (backend.Config.Options, or a dispatcher
// Config's BackendOptions["nccl"]) runs with k. The zero Knobs detaches.
// Entries live as long as the process; tests make few.
func Set(opts any, k Knobs) {
	mu.Lock()
	defer mu.Unlock()
	if k == (Knobs{}) {
		delete(knobs, opts)
		return
	}
	knobs[opts] = k
}

// Of returns the knobs attached to opts, a *nccl.Options (the zero Knobs
// when none are).
func Of(opts any) Knobs {
	mu.Lock()
	defer mu.Unlock()
	return knobs[opts]
}
