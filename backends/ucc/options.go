package ucc

import (
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
)

// Environment variables read when the matching option is left zero.
const (
	// EnvPollSpin sets Options.PollSpin, in microseconds.
	EnvPollSpin = "GOCOLL_UCC_POLL_SPIN_US"
	// EnvMaxPark sets Options.MaxPark, in microseconds.
	EnvMaxPark = "GOCOLL_UCC_MAX_PARK_US"
	// EnvYield sets Options.Yield: auto, always or never.
	EnvYield = "GOCOLL_UCC_YIELD"
	// EnvFingerprints sets Options.Fingerprints.
	EnvFingerprints = "GOCOLL_UCC_FINGERPRINTS"
	// EnvFingerprintsAhead sets Options.FingerprintsAhead: on or off.
	EnvFingerprintsAhead = "GOCOLL_UCC_FP_AHEAD"
	// EnvLocalWorldSize is torchrun's count of the ranks on this host,
	// which Options.Yield's auto compares with the cores.
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
)

// Values of Options.Yield.
const (
	YieldAuto   = "auto"
	YieldAlways = "always"
	YieldNever  = "never"
)

// Defaults of Options.
const (
	DefaultPollSpin       = 50 * time.Microsecond
	DefaultMaxPark        = time.Millisecond
	defaultConnectTimeout = 5 * time.Minute
)

// Options are ucc's backend options (backend.Config.Options, as *Options
// or Options; nil is Options{}). The zero value of every field is its
// default, which the field's variable, when set, replaces; a set field wins
// over the variable (internal/knob's rule). Invalid values fail New, and so
// dispatcher.Init, naming the field or variable. The library itself is
// found through GOCOLL_UCC_LIBRARY (LibraryEnv), else the soname.
type Options struct {
	// ConnectTimeout bounds the wire-up (UCC context and team, over the
	// store) on every rank. Default: the group's timeout, or 5 minutes.
	ConnectTimeout time.Duration
	// PollSpin is how long the progress goroutine calls
	// ucc_context_progress back to back, while ops are pending and nothing
	// completes, before it starts to sleep between rounds (UCC has no
	// wake-up fd). Negative: never spin. Default 50 µs
	// (GOCOLL_UCC_POLL_SPIN_US).
	PollSpin time.Duration
	// MaxPark is the longest sleep between progress rounds while ops are
	// pending; the sleep doubles from 1 µs up to it. With nothing pending
	// the goroutine blocks and costs nothing. Default 1 ms
	// (GOCOLL_UCC_MAX_PARK_US).
	MaxPark time.Duration
	// Yield says whether a goroutine waiting in UCC gives its core away
	// (sched_yield) between progress rounds, as Open MPI does when
	// mpirun oversubscribes: "always", "never", or "auto", the default
	// (GOCOLL_UCC_YIELD): yield when the ranks on this host
	// (LOCAL_WORLD_SIZE, else the group's size) outnumber the cores this
	// process may run on. Why: UCC completes an op only while every rank
	// progresses it, and a rank spinning in ucc_context_progress holds
	// the core its peer needs for its whole time slice (milliseconds per
	// op at 4 ranks on 2 cores, raw libucc alike); with cores to spare, a
	// yield only adds a system call per round. When yielding, the
	// progress goroutine does not spin either (PollSpin is taken as
	// negative).
	Yield string
	// Fingerprints is the check of the ops' fingerprints before UCC sees
	// them (fingerprint.go): "auto" (the default) carries them in shared
	// memory when every rank is on one host, else over a TCP side channel;
	// "shm" or "tcp" force one; "off" posts ops to UCC at issue, unchecked
	// (GOCOLL_UCC_FINGERPRINTS).
	Fingerprints string
	// FingerprintsAhead lets a rank post an op to UCC at issue, before its
	// peers' fingerprints are in, when the op is an in-place allreduce
	// equal to the last op the group agreed on (fpahead.go: the check then
	// runs while UCC does, and a rank whose op differs posts that same
	// collective over scratch memory, so a mismatch still fails on every
	// rank in the same words and the group works on). "on" (the default)
	// or "off": every op waits for its peers' fingerprints
	// (GOCOLL_UCC_FP_AHEAD). Ranks may differ in it.
	FingerprintsAhead string
}

func field(name string) string { return "ucc.Options." + name }

var (
	knobPollSpin = knob.Knob[time.Duration]{Field: field("PollSpin"), Env: []string{EnvPollSpin}, Default: DefaultPollSpin,
		Parse: knob.Units(time.Microsecond)}
	knobMaxPark = knob.Knob[time.Duration]{Field: field("MaxPark"), Env: []string{EnvMaxPark}, Default: DefaultMaxPark,
		Parse: knob.Units(time.Microsecond), Check: knob.Positive[time.Duration]}
	knobYield = knob.Knob[string]{Field: field("Yield"), Env: []string{EnvYield}, Default: YieldAuto,
		Check: knob.OneOf(YieldAuto, YieldAlways, YieldNever)}
	knobFingerprints = knob.Knob[string]{Field: field("Fingerprints"), Env: []string{EnvFingerprints}, Default: FingerprintsAuto,
		Check: knob.OneOf(FingerprintsAuto, FingerprintsShm, FingerprintsTCP, FingerprintsOff)}
	knobAhead = knob.Knob[string]{Field: field("FingerprintsAhead"), Env: []string{EnvFingerprintsAhead}, Default: AheadOn,
		Check: knob.OneOf(AheadOn, AheadOff)}
)

// Values of Options.FingerprintsAhead.
const (
	AheadOn  = "on"
	AheadOff = "off"
)

// optionsOf reads backend.Config.Options.
func optionsOf(v any) (Options, error) {
	switch o := v.(type) {
	case nil:
		return Options{}, nil
	case Options:
		return o, nil
	case *Options:
		if o == nil {
			return Options{}, nil
		}
		return *o, nil
	}
	return Options{}, fmt.Errorf("%w: ucc: options of type %T (want *ucc.Options)", backend.ErrInvalidArgument, v)
}

// resolveOptions fills o's zero fields from env, else the defaults, and
// checks every value; groupTimeout is ConnectTimeout's default.
func resolveOptions(o Options, groupTimeout time.Duration, env knob.Env) (Options, error) {
	var err error
	o.PollSpin, err = knobPollSpin.Resolve(env, o.PollSpin)
	if err == nil {
		o.MaxPark, err = knobMaxPark.Resolve(env, o.MaxPark)
	}
	if err == nil {
		o.Yield, err = knobYield.Resolve(env, o.Yield)
	}
	if err == nil {
		o.Fingerprints, err = knobFingerprints.Resolve(env, o.Fingerprints)
	}
	if err == nil {
		o.FingerprintsAhead, err = knobAhead.Resolve(env, o.FingerprintsAhead)
	}
	if err == nil {
		def := groupTimeout
		if def <= 0 {
			def = defaultConnectTimeout
		}
		o.ConnectTimeout, err = knob.Knob[time.Duration]{Field: field("ConnectTimeout"), Default: def,
			Check: knob.Positive[time.Duration]}.Resolve(env, o.ConnectTimeout)
	}
	if err != nil {
		return o, fmt.Errorf("%w: ucc: %w", backend.ErrInvalidArgument, err)
	}
	return o, nil
}

// yields resolves Options.Yield (resolved: never the empty string) for a
// group of worldSize ranks on a process that may run on cpus cores.
// LOCAL_WORLD_SIZE, when set to a positive number, counts the ranks on
// this host; else the whole group is taken to be here (a group spread
// over hosts yields needlessly only when it has more ranks than a host
// has cores, which costs a system call per progress round).
func yields(yield string, worldSize, cpus int, env knob.Env) bool {
	switch yield {
	case YieldAlways:
		return true
	case YieldNever:
		return false
	}
	local := worldSize
	if _, v, ok := env.Lookup(EnvLocalWorldSize); ok {
		if n, err := knob.ParseInt(v); err == nil && n > 0 {
			local = n
		}
	}
	return local > cpus
}
