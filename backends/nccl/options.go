package nccl

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrorPolicy says what the watchdog does after an op times out or NCCL
// reports an asynchronous error (PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING).
type ErrorPolicy int

// The policies, numbered as PyTorch's values of the variable.
const (
	// NoHandling only fails the op's Work.
	NoHandling ErrorPolicy = 0
	// TearDown aborts the communicators, logs one fatal line and ends the
	// process.
	TearDown ErrorPolicy = 1
	// CleanUpOnly aborts the communicators and fails pending Works with
	// ErrAborted; the process lives on.
	CleanUpOnly ErrorPolicy = 2
	// SkipCleanUp logs one fatal line and ends the process without aborting
	// the communicators (abort itself can hang). PyTorch's default.
	SkipCleanUp ErrorPolicy = 3
)

// String returns the policy's name.
func (p ErrorPolicy) String() string {
	switch p {
	case NoHandling:
		return "NoHandling"
	case TearDown:
		return "TearDown"
	case CleanUpOnly:
		return "CleanUpOnly"
	case SkipCleanUp:
		return "SkipCleanUp"
	}
	return fmt.Sprintf("ErrorPolicy(%d)", int(p))
}

// Options are the NCCL backend's options, passed as backend.Config.Options.
// Build them with DefaultOptions or OptionsFromEnv; the zero value is not
// the defaults (RanksPerRoot 0 and a zero watchdog interval are rejected).
type Options struct {
	// HighPriorityStream makes the internal streams the device's highest
	// priority (GOCOLL_NCCL_HIGH_PRIORITY forces it on).
	HighPriorityStream bool
	// BlockingWait makes Work.Wait block the host until the op completes
	// or times out, polling every millisecond, and return the error to the
	// caller (GOCOLL_NCCL_BLOCKING_WAIT). A timeout then aborts the
	// group's communicators, so later ops fail with ErrAborted keeping the
	// reason. The watchdog only retires completions: it applies no
	// ErrorPolicy (blocking wait wins over it, as in PyTorch).
	BlockingWait bool
	// ErrorPolicy is applied by the watchdog on timeouts, async errors and
	// a peer's error seen through the store (GOCOLL_NCCL_ASYNC_ERROR_HANDLING,
	// 0-3; default SkipCleanUp).
	ErrorPolicy ErrorPolicy
	// NaNCheck runs a kernel over every input an op sends before issuing
	// it; an input with a NaN fails the op on this rank with an error
	// wrapping ErrInvalidArgument and ErrNaN (GOCOLL_NCCL_NAN_CHECK). The
	// host waits for the check, so it costs a stream synchronisation per
	// op. Receive buffers are not checked.
	NaNCheck bool
	// AbortTimeout bounds an abort of the group's communicators (default
	// 10 s): they are aborted concurrently, and the abort gives up waiting
	// for ncclCommAbort after this long.
	AbortTimeout time.Duration
	// EnableTiming records a start event per op, so that IsStarted and
	// Duration work (GOCOLL_NCCL_ENABLE_TIMING).
	EnableTiming bool
	// NonBlocking creates communicators with config.blocking = 0 and polls
	// them (GOCOLL_NCCL_USE_COMM_NONBLOCKING).
	NonBlocking bool
	// NonBlockingTimeout bounds the polling of a nonblocking communicator's
	// init, split and abort (GOCOLL_NCCL_NONBLOCKING_TIMEOUT, seconds;
	// default 30 min).
	NonBlockingTimeout time.Duration
	// RanksPerRoot: above this many ranks, init uses several bootstrap roots
	// (ncclCommInitRankScalable) (GOCOLL_NCCL_RANKS_PER_ROOT, default 128).
	RanksPerRoot int
	// ForceScalableInit uses ncclCommInitRankScalable whatever the size;
	// for tests.
	ForceScalableInit bool
	// WatchdogInterval is how often the watchdog polls (default 100 ms).
	WatchdogInterval time.Duration
	// MinCTAs, MaxCTAs and CGAClusterSize go into ncclConfig_t when > 0
	// (CGAClusterSize when >= 0; -1 leaves it to NCCL).
	MinCTAs, MaxCTAs, CGAClusterSize int
	// NetName selects NCCL's network plugin by name ("" = NCCL's choice).
	NetName string
	// SplitColor, when not nil, is the color this group passes to
	// ncclCommSplit; by default it is derived from the group's global ranks.
	SplitColor *int

	// DisableStash turns off keeping async ops' tensors alive until Wait.
	// Only for tests that show why the stash exists: freeing an input
	// early then corrupts the op.
	DisableStash bool
	// HangWatchdogForTest makes the watchdog stop advancing (it blocks
	// until Close), so that the heartbeat monitor fires. Only for tests.
	HangWatchdogForTest bool
}

// DefaultOptions returns the defaults, without reading the environment.
func DefaultOptions() Options {
	return Options{
		ErrorPolicy:        SkipCleanUp,
		NonBlockingTimeout: 30 * time.Minute,
		RanksPerRoot:       128,
		WatchdogInterval:   100 * time.Millisecond,
		AbortTimeout:       10 * time.Second,
		CGAClusterSize:     -1,
	}
}

// envLookup returns GOCOLL_<name>, else TORCH_<name>, else a legacy alias.
func envLookup(name string, aliases ...string) (string, string, bool) {
	for _, n := range append([]string{"GOCOLL_" + name, "TORCH_" + name}, aliases...) {
		if v, ok := os.LookupEnv(n); ok && v != "" {
			return n, v, true
		}
	}
	return "", "", false
}

func envBool(name string, aliases ...string) (bool, bool, error) {
	n, v, ok := envLookup(name, aliases...)
	if !ok {
		return false, false, nil
	}
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on", "y":
		return true, true, nil
	case "0", "false", "no", "off", "n":
		return false, true, nil
	}
	return false, false, fmt.Errorf("nccl: %s=%q is not a boolean", n, v)
}

func envInt(name string, aliases ...string) (int, bool, error) {
	n, v, ok := envLookup(name, aliases...)
	if !ok {
		return 0, false, nil
	}
	i, err := strconv.Atoi(v)
	if err != nil {
		return 0, false, fmt.Errorf("nccl: %s=%q is not an integer", n, v)
	}
	return i, true, nil
}

// OptionsFromEnv returns DefaultOptions overridden by the environment:
// GOCOLL_NCCL_HIGH_PRIORITY, GOCOLL_NCCL_BLOCKING_WAIT,
// GOCOLL_NCCL_ASYNC_ERROR_HANDLING, GOCOLL_NCCL_ENABLE_TIMING,
// GOCOLL_NCCL_USE_COMM_NONBLOCKING, GOCOLL_NCCL_NONBLOCKING_TIMEOUT,
// GOCOLL_NCCL_RANKS_PER_ROOT, GOCOLL_NCCL_NAN_CHECK; each also read as TORCH_NCCL_* (and
// NCCL_BLOCKING_WAIT, NCCL_ASYNC_ERROR_HANDLING, PyTorch's legacy names).
// Invalid values are errors.
func OptionsFromEnv() (Options, error) {
	o := DefaultOptions()
	return o, o.applyEnv()
}

func (o *Options) applyEnv() error {
	if v, ok, err := envBool("NCCL_HIGH_PRIORITY"); err != nil {
		return err
	} else if ok {
		o.HighPriorityStream = o.HighPriorityStream || v
	}
	if v, ok, err := envBool("NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"); err != nil {
		return err
	} else if ok {
		o.BlockingWait = v
	}
	if v, ok, err := envInt("NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"); err != nil {
		return err
	} else if ok {
		o.ErrorPolicy = ErrorPolicy(v)
	}
	if v, ok, err := envBool("NCCL_ENABLE_TIMING"); err != nil {
		return err
	} else if ok {
		o.EnableTiming = v
	}
	if v, ok, err := envBool("NCCL_USE_COMM_NONBLOCKING"); err != nil {
		return err
	} else if ok {
		o.NonBlocking = v
	}
	if v, ok, err := envInt("NCCL_NONBLOCKING_TIMEOUT"); err != nil {
		return err
	} else if ok {
		o.NonBlockingTimeout = time.Duration(v) * time.Second
	}
	if v, ok, err := envBool("NCCL_NAN_CHECK"); err != nil {
		return err
	} else if ok {
		o.NaNCheck = v
	}
	if v, ok, err := envInt("NCCL_RANKS_PER_ROOT"); err != nil {
		return err
	} else if ok {
		o.RanksPerRoot = v
	}
	return o.validate()
}

func (o *Options) validate() error {
	switch {
	case o.ErrorPolicy < NoHandling || o.ErrorPolicy > SkipCleanUp:
		return fmt.Errorf("nccl: error policy %d out of range 0..3", int(o.ErrorPolicy))
	case o.RanksPerRoot <= 0:
		return fmt.Errorf("nccl: RanksPerRoot must be positive, got %d", o.RanksPerRoot)
	case o.WatchdogInterval <= 0:
		return fmt.Errorf("nccl: WatchdogInterval must be positive, got %v", o.WatchdogInterval)
	case o.AbortTimeout <= 0:
		return fmt.Errorf("nccl: AbortTimeout must be positive, got %v", o.AbortTimeout)
	case o.NonBlockingTimeout <= 0:
		return fmt.Errorf("nccl: NonBlockingTimeout must be positive, got %v", o.NonBlockingTimeout)
	case o.MinCTAs < 0 || o.MaxCTAs < 0 || (o.MaxCTAs > 0 && o.MinCTAs > o.MaxCTAs):
		return fmt.Errorf("nccl: bad CTA bounds min %d max %d", o.MinCTAs, o.MaxCTAs)
	}
	return nil
}
