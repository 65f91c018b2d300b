package nccl

import (
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
)

// ErrorPolicy says what the watchdog does after an op times out or NCCL
// reports an asynchronous error (PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING).
// Its zero value, DefaultPolicy, means "the environment's, else
// SkipCleanUp"; the values of the variable keep PyTorch's numbering (0
// NoHandling, 1 TearDown, 2 CleanUpOnly, 3 SkipCleanUp), which the Go
// constants do not share.
type ErrorPolicy int

// The policies.
const (
	// DefaultPolicy is the zero value: GOCOLL_NCCL_ASYNC_ERROR_HANDLING (or
	// its aliases) when set, else SkipCleanUp. Resolved options never hold
	// it.
	DefaultPolicy ErrorPolicy = iota
	// NoHandling only fails the op's Work (variable value 0).
	NoHandling
	// TearDown aborts the communicators, logs one fatal line and ends the
	// process (variable value 1).
	TearDown
	// CleanUpOnly aborts the communicators and fails pending Works with
	// ErrAborted; the process lives on (variable value 2).
	CleanUpOnly
	// SkipCleanUp logs one fatal line and ends the process without aborting
	// the communicators (abort itself can hang). PyTorch's default
	// (variable value 3).
	SkipCleanUp
)

// String returns the policy's name.
func (p ErrorPolicy) String() string {
	switch p {
	case DefaultPolicy:
		return "DefaultPolicy"
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

// parsePolicy reads PyTorch's numbering of TORCH_NCCL_ASYNC_ERROR_HANDLING.
func parsePolicy(s string) (ErrorPolicy, error) {
	switch s {
	case "0":
		return NoHandling, nil
	case "1":
		return TearDown, nil
	case "2":
		return CleanUpOnly, nil
	case "3":
		return SkipCleanUp, nil
	}
	return 0, knob.Want("0 (NoHandling), 1 (TearDown), 2 (CleanUpOnly) or 3 (SkipCleanUp)")
}

// Options are the NCCL backend's options, passed as backend.Config.Options
// (Options or *Options; nil is Options{}). The zero value of every field
// means its default, which the field's environment variable, when set,
// replaces; a field that is set wins over the variable (internal/knob's
// rule). Each variable is read as GOCOLL_NCCL_<NAME>, then
// TORCH_NCCL_<NAME> (and, for blocking wait and async error handling,
// PyTorch's legacy NCCL_<NAME>). A false boolean counts as unset: the
// variable can turn it on. Invalid values, of fields or variables, fail
// New (and so dispatcher.Init) with an error naming them; ResolveOptions
// applies the same rules without a GPU.
type Options struct {
	// HighPriorityStream makes the internal streams the device's highest
	// priority (GOCOLL_NCCL_HIGH_PRIORITY).
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
	// PyTorch's 0-3; zero, DefaultPolicy: the variable, else SkipCleanUp).
	ErrorPolicy ErrorPolicy
	// NaNCheck runs a kernel over every input an op sends before issuing
	// it; an input with a NaN fails the op on this rank with an error
	// wrapping ErrInvalidArgument and ErrNaN (GOCOLL_NCCL_NAN_CHECK). The
	// host waits for the check, so it costs a stream synchronisation per
	// op. Receive buffers are not checked.
	NaNCheck bool
	// AbortTimeout bounds an abort of the group's communicators (zero: 10
	// s; negative is invalid): they are aborted concurrently, and the abort
	// gives up waiting for ncclCommAbort after this long.
	AbortTimeout time.Duration
	// EnableTiming records a start event per op, so that IsStarted and
	// Duration work (GOCOLL_NCCL_ENABLE_TIMING).
	EnableTiming bool
	// AsyncOnCurrentStream queues async ops (Async: true) on ctx's current
	// stream, as sync ops are, instead of the internal stream
	// (GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM; no TORCH_ name: PyTorch has no
	// such switch, it does this for async_op=False since 2.7). The op makes
	// no sync event and no stream wait: it runs in the order of that
	// stream's kernels, so it does not overlap with compute queued on the
	// same stream (queue compute on another stream to overlap). Wait makes
	// ctx's current stream wait on the op's end event only when that is
	// another stream than the op's (Work.Stream()); the tensors stay
	// stashed until Wait; completion, IsCompleted, WaitHost, timeouts and
	// the watchdog go by the end event as in the default mode. An op's
	// timeout counts from its issue, so time the op spends queued behind
	// the stream's earlier kernels counts, as for sync ops.
	AsyncOnCurrentStream bool
	// NonBlocking creates communicators with config.blocking = 0 and polls
	// them (GOCOLL_NCCL_USE_COMM_NONBLOCKING).
	NonBlocking bool
	// NonBlockingTimeout bounds the polling of a nonblocking communicator's
	// init, split and abort (GOCOLL_NCCL_NONBLOCKING_TIMEOUT, whole
	// seconds; zero: 30 min; negative is invalid).
	NonBlockingTimeout time.Duration
	// RanksPerRoot: above this many ranks, init uses several bootstrap roots
	// (ncclCommInitRankScalable) (GOCOLL_NCCL_RANKS_PER_ROOT; zero: 128;
	// negative is invalid).
	RanksPerRoot int
	// WatchdogInterval is how often the watchdog polls (zero: 100 ms;
	// negative is invalid).
	WatchdogInterval time.Duration
	// MinCTAs and MaxCTAs, when > 0, go into ncclConfig_t (zero: NCCL's
	// choice; negative is invalid; MinCTAs <= MaxCTAs when both are set).
	MinCTAs, MaxCTAs int
	// CGAClusterSize goes into ncclConfig_t: zero leaves it to NCCL, a
	// positive value sets it, and a negative value sets 0 (no clusters),
	// since the zero value must mean the default.
	CGAClusterSize int
	// NetName selects NCCL's network plugin by name ("" = NCCL's choice).
	NetName string
	// SplitColor, when not nil, is the color this group passes to
	// ncclCommSplit; by default it is derived from the group's global ranks.
	SplitColor *int
}

// DefaultOptions returns what Options{} resolves to in an empty
// environment, with every default written out. It does not read the
// environment; passed as options, its set fields then win over the
// variables (its false booleans do not). Options{} is what most callers
// want.
func DefaultOptions() Options {
	return Options{
		ErrorPolicy:        SkipCleanUp,
		NonBlockingTimeout: 30 * time.Minute,
		RanksPerRoot:       128,
		WatchdogInterval:   100 * time.Millisecond,
		AbortTimeout:       10 * time.Second,
	}
}

// OptionsFromEnv returns Options{} resolved against the process
// environment: ResolveOptions(Options{}).
func OptionsFromEnv() (Options, error) { return ResolveOptions(Options{}) }

// ResolveOptions returns o with every zero field replaced by its
// variable's value or its default, and checks every value; the error
// wraps backend.ErrInvalidArgument and names the field or variable and the
// value. New calls it; resolving resolved options changes nothing.
func ResolveOptions(o Options) (Options, error) { return resolveOptions(o, knob.OS) }

// vars are the names of one nccl variable: GOCOLL_NCCL_<name>,
// TORCH_NCCL_<name>, then legacy names.
func vars(name string, legacy ...string) []string {
	return append([]string{"GOCOLL_NCCL_" + name, "TORCH_NCCL_" + name}, legacy...)
}

func boolKnob(field string, env ...string) knob.Knob[bool] {
	return knob.Knob[bool]{Field: "nccl.Options." + field, Env: env, Parse: knob.ParseBool}
}

// The knobs of Options, one per field that has a default or a variable.
var (
	knobHighPriority = boolKnob("HighPriorityStream", vars("HIGH_PRIORITY")...)
	knobBlockingWait = boolKnob("BlockingWait", vars("BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")...)
	knobNaNCheck     = boolKnob("NaNCheck", vars("NAN_CHECK")...)
	knobTiming       = boolKnob("EnableTiming", vars("ENABLE_TIMING")...)
	knobNonBlocking  = boolKnob("NonBlocking", vars("USE_COMM_NONBLOCKING")...)
	knobCurStream    = boolKnob("AsyncOnCurrentStream", "GOCOLL_NCCL_ASYNC_ON_CURRENT_STREAM")
	knobPolicy       = knob.Knob[ErrorPolicy]{Field: "nccl.Options.ErrorPolicy",
		Env: vars("ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"), Default: SkipCleanUp, Parse: parsePolicy,
		Check: func(p ErrorPolicy) error {
			if p < NoHandling || p > SkipCleanUp {
				return knob.Want("NoHandling, TearDown, CleanUpOnly or SkipCleanUp")
			}
			return nil
		}}
	knobNonBlockingTimeout = knob.Knob[time.Duration]{Field: "nccl.Options.NonBlockingTimeout",
		Env: vars("NONBLOCKING_TIMEOUT"), Default: 30 * time.Minute, Parse: knob.Units(time.Second), Check: knob.Positive[time.Duration]}
	knobRanksPerRoot = knob.Knob[int]{Field: "nccl.Options.RanksPerRoot",
		Env: vars("RANKS_PER_ROOT"), Default: 128, Parse: knob.ParseInt, Check: knob.Positive[int]}
	knobAbortTimeout = knob.Knob[time.Duration]{Field: "nccl.Options.AbortTimeout",
		Default: 10 * time.Second, Check: knob.Positive[time.Duration]}
	knobWatchdogInterval = knob.Knob[time.Duration]{Field: "nccl.Options.WatchdogInterval",
		Default: 100 * time.Millisecond, Check: knob.Positive[time.Duration]}
	knobMinCTAs = knob.Knob[int]{Field: "nccl.Options.MinCTAs", Check: knob.NonNegative[int]}
	knobMaxCTAs = knob.Knob[int]{Field: "nccl.Options.MaxCTAs", Check: knob.NonNegative[int]}
)

// resolveOptions is ResolveOptions against env: a pure function, so that
// tests need neither a GPU nor the process environment.
func resolveOptions(o Options, env knob.Env) (Options, error) {
	var err error
	set := func(dst *bool, k knob.Knob[bool]) {
		if err == nil {
			*dst, err = k.Resolve(env, *dst)
		}
	}
	set(&o.HighPriorityStream, knobHighPriority)
	set(&o.BlockingWait, knobBlockingWait)
	set(&o.NaNCheck, knobNaNCheck)
	set(&o.EnableTiming, knobTiming)
	set(&o.NonBlocking, knobNonBlocking)
	set(&o.AsyncOnCurrentStream, knobCurStream)
	if err == nil {
		o.ErrorPolicy, err = knobPolicy.Resolve(env, o.ErrorPolicy)
	}
	for _, d := range []struct {
		dst *time.Duration
		k   knob.Knob[time.Duration]
	}{{&o.NonBlockingTimeout, knobNonBlockingTimeout}, {&o.AbortTimeout, knobAbortTimeout}, {&o.WatchdogInterval, knobWatchdogInterval}} {
		if err == nil {
			*d.dst, err = d.k.Resolve(env, *d.dst)
		}
	}
	for _, i := range []struct {
		dst *int
		k   knob.Knob[int]
	}{{&o.RanksPerRoot, knobRanksPerRoot}, {&o.MinCTAs, knobMinCTAs}, {&o.MaxCTAs, knobMaxCTAs}} {
		if err == nil {
			*i.dst, err = i.k.Resolve(env, *i.dst)
		}
	}
	if err == nil && o.MinCTAs > 0 && o.MaxCTAs > 0 && o.MinCTAs > o.MaxCTAs {
		err = fmt.Errorf("nccl.Options.MinCTAs=%d is above nccl.Options.MaxCTAs=%d", o.MinCTAs, o.MaxCTAs)
	}
	if err != nil {
		return o, fmt.Errorf("%w: nccl: %w", backend.ErrInvalidArgument, err)
	}
	return o, nil
}

// cgaClusterSize is the value of ncclConfig_t.cgaClusterSize that
// CGAClusterSize asks for; -1 leaves NCCL's default in place.
func (o *Options) cgaClusterSize() int {
	switch {
	case o.CGAClusterSize == 0:
		return -1
	case o.CGAClusterSize < 0:
		return 0
	}
	return o.CGAClusterSize
}
