package watch

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config configures a Watchdog.
type Config struct {
	// Policy applies to the failures the watchdog finds.
	Policy Policy
	// BlockingWait moves failure detection into the caller's wait
	// (PyTorch's TORCH_NCCL_BLOCKING_WAIT): Tick then finds no timeouts,
	// the failures come through BlockingWait and Report, and they abort
	// the backend in the background instead of applying Policy (blocking
	// wait wins over the policy, as in PyTorch).
	BlockingWait bool
	// Rank is this rank: its own signal in the store is not a peer's.
	Rank int
	// Dump is set when there is a flight recorder to dump: the first
	// failure of the backend, the one worth a dump, gets a Dump action.
	Dump bool
	// Signal is set when the peers can be told through the store: the
	// first failure this rank found itself gets a Signal action.
	Signal bool
	// DumpGrace is how long an Exit waits when this backend dumped, so that
	// the peers see the dump signal (their monitors poll the store every
	// second by default).
	DumpGrace time.Duration
}

// entry is one pending work.
type entry[W comparable] struct {
	w       W
	comm    string
	enq     time.Time
	timeout time.Duration
	failed  bool // the unit failed it; it stays until retired
	done    bool // retired: a hole until the next compaction
}

// Watchdog is the failure policy of one backend instance: it holds the
// works that were enqueued and not yet seen finished, finds their
// timeouts at Tick, fails them on asynchronous and remote errors, and
// applies the Policy. Its zero value is not usable; make it with
// NewWatchdog.
type Watchdog[W comparable] struct {
	cfg Config
	// pending is in enqueue order. There is no index by work: Enqueue is
	// on every op's hot path, where a map insert costs more than the
	// append; lookups (a blocking waiter's check, Report) scan, and
	// the driver retires finished works in bulk with Retire.
	pending []entry[W]
	gone    int // retired entries still in pending (compacted at Tick)
	front   int // pending[:front] are all holes (RetireFront resumes there)

	dumped     bool   // a Dump action was issued
	signalled  bool   // a Signal action was issued
	aborted    bool   // an Abort action was issued
	exiting    bool   // an Exit action was issued: nothing more to decide
	remoteSeen string // the last peer signal acted on
}

// NewWatchdog returns an empty watchdog.
func NewWatchdog[W comparable](cfg Config) *Watchdog[W] {
	return &Watchdog[W]{cfg: cfg}
}

// Config returns the watchdog's configuration.
func (u *Watchdog[W]) Config() Config { return u.cfg }

// Enqueue adds a work that went to the device at enq with its timeout, on
// communicator comm. Each work is enqueued once.
func (u *Watchdog[W]) Enqueue(w W, comm string, enq time.Time, timeout time.Duration) {
	u.pending = append(u.pending, entry[W]{w: w, comm: comm, enq: enq, timeout: timeout})
}

// Retire drops every pending work for which finished reports true
// (completed, or failed by anyone), in one pass: the driver's way to hand
// back what it found finished.
func (u *Watchdog[W]) Retire(finished func(W) bool) {
	for i := range u.pending {
		if !u.pending[i].done && finished(u.pending[i].w) {
			u.hole(i)
		}
	}
	u.maybeCompact()
}

// RetireFront is Retire for a driver that sees works finish in enqueue
// order (a backend that retires a stream's works in order as it issues):
// it drops the finished works at the front of the pending list, up to the
// first one that is not, and appends them to dst. Its cost is what it
// drops, where Retire looks at every pending work; so the issuing
// goroutine can call it every few ops, and what those works hold is let
// go of at once rather than at the driver's next round.
func (u *Watchdog[W]) RetireFront(finished func(W) bool, dst []W) []W {
	i := u.front
	for ; i < len(u.pending); i++ {
		e := &u.pending[i]
		if e.done {
			continue
		}
		if !finished(e.w) {
			break
		}
		dst = append(dst, e.w)
		u.hole(i)
	}
	u.front = i
	u.maybeCompact()
	return dst
}

func (u *Watchdog[W]) hole(i int) {
	u.pending[i] = entry[W]{done: true, failed: true}
	u.gone++
}

func (u *Watchdog[W]) maybeCompact() {
	if u.gone > 64 && u.gone > len(u.pending)/2 {
		u.compact()
	}
}

// find returns the position of w in pending.
func (u *Watchdog[W]) find(w W) (int, bool) {
	for i := range u.pending {
		if e := &u.pending[i]; !e.done && e.w == w {
			return i, true
		}
	}
	return 0, false
}

// compact removes the holes Retire left.
func (u *Watchdog[W]) compact() {
	if u.gone == 0 {
		return
	}
	live := u.pending[:0]
	for _, e := range u.pending {
		if !e.done {
			live = append(live, e)
		}
	}
	clear(u.pending[len(live):])
	u.pending = live
	u.gone, u.front = 0, 0
}

// Len is the number of pending works.
func (u *Watchdog[W]) Len() int { return len(u.pending) - u.gone }

// AppendPending appends the pending works to dst, in enqueue order.
func (u *Watchdog[W]) AppendPending(dst []W) []W {
	for _, e := range u.pending {
		if !e.done {
			dst = append(dst, e.w)
		}
	}
	return dst
}

// Tick finds the works that have run past their timeout at now (none in
// blocking-wait mode, where the waiter checks) and fails them.
func (u *Watchdog[W]) Tick(now time.Time) []Action[W] {
	u.compact()
	if u.cfg.BlockingWait || u.exiting {
		return nil
	}
	var acts []Action[W]
	for i := range u.pending {
		e := &u.pending[i]
		if e.failed {
			continue
		}
		if d := now.Sub(e.enq); d > e.timeout {
			acts = u.local(acts, &Failure[W]{Kind: Timeout, Work: e.w, Elapsed: d})
			if u.exiting {
				break
			}
		}
	}
	return acts
}

// AsyncError fails every pending work of communicator comm, on which the
// native library reported an asynchronous error (cause); remote says the
// library blames a peer. The first failure is dumped and, when it is this
// rank's own, signalled to the peers; then the policy applies.
func (u *Watchdog[W]) AsyncError(comm string, remote bool, cause error) []Action[W] {
	if u.exiting {
		return nil
	}
	kind := Async
	if remote {
		kind = AsyncRemote
	}
	var acts []Action[W]
	var first *Failure[W]
	for i := range u.pending {
		e := &u.pending[i]
		if e.failed || e.comm != comm {
			continue
		}
		f := &Failure[W]{Kind: kind, Work: e.w, Comm: comm, Cause: cause}
		if first == nil {
			first = f
			acts = u.dump(acts, f)
		}
		e.failed = true
		acts = append(acts, Action[W]{Kind: Fail, Failure: f})
	}
	if first == nil {
		return nil
	}
	if !remote {
		acts = u.signal(acts, first)
	}
	return u.policy(acts, first)
}

// SignalValue is what a rank that fails writes to the store for its peers:
// its rank, the time and its error on one line.
func SignalValue(rank int, at time.Time, msg string) string {
	return fmt.Sprintf("%d\n%d\n%s", rank, at.UnixNano(), strings.ReplaceAll(msg, "\n", " "))
}

// WantsRemote reports whether a peer's signal could fail anything now: a
// driver reads the store only then.
func (u *Watchdog[W]) WantsRemote() bool {
	if u.exiting {
		return false
	}
	for _, e := range u.pending {
		if !e.failed {
			return true
		}
	}
	return false
}

// RemoteSignal feeds the value a peer published in the store (see
// SignalValue). A new value from another rank fails every pending work
// with a Remote failure naming that rank, and the policy applies; there is
// no dump (the peer asked every rank to dump already) and no signal (it is
// the peer's). A signal seen while nothing is pending is kept for later,
// as a driver that reads the store only when WantsRemote does.
func (u *Watchdog[W]) RemoteSignal(value string) []Action[W] {
	if !u.WantsRemote() || value == u.remoteSeen {
		return nil
	}
	u.remoteSeen = value
	parts := strings.SplitN(value, "\n", 3)
	if len(parts) != 3 {
		return nil
	}
	r, err := strconv.Atoi(parts[0])
	if err != nil || r == u.cfg.Rank {
		return nil
	}
	var acts []Action[W]
	var first *Failure[W]
	for i := range u.pending {
		e := &u.pending[i]
		if e.failed {
			continue
		}
		f := &Failure[W]{Kind: Remote, Work: e.w, Peer: r, Message: parts[2]}
		if first == nil {
			first = f
		}
		e.failed = true
		acts = append(acts, Action[W]{Kind: Fail, Failure: f})
	}
	return u.policy(acts, first)
}

// Abort is a user's abort of the backend: one Abort action (with no
// failure: the driver has the user's reason), whatever the policy; every
// pending work is failed by it.
func (u *Watchdog[W]) Abort() []Action[W] {
	u.aborted = true
	u.failAll()
	return []Action[W]{{Kind: Abort}}
}

// BlockingWait is a blocking waiter's check of its work w at now: when w
// has run past its timeout, it fails it (dump, fail, signal, abort in the
// background). It returns nothing while w may still finish in time, and
// nothing outside blocking-wait mode.
func (u *Watchdog[W]) BlockingWait(w W, now time.Time) []Action[W] {
	i, ok := u.find(w)
	if !ok || !u.cfg.BlockingWait || u.exiting {
		return nil
	}
	e := &u.pending[i]
	if e.failed {
		return nil
	}
	d := now.Sub(e.enq)
	if d <= e.timeout {
		return nil
	}
	return u.local(nil, &Failure[W]{Kind: Timeout, Work: w, Elapsed: d, Blocking: true})
}

// Report feeds a failure the backend found itself: an asynchronous error a
// blocking waiter saw, or a deadline that a host backend's op ran out of.
// The work need not be pending. It gets the actions of a failure the
// watchdog had found: dump once, fail, signal once (unless a peer is to
// blame), then the policy (or, in blocking-wait mode, an abort in the
// background).
func (u *Watchdog[W]) Report(f Failure[W]) []Action[W] {
	if u.exiting {
		return nil
	}
	if i, ok := u.find(f.Work); ok {
		if u.pending[i].failed {
			return nil
		}
	}
	return u.local(nil, &f)
}

// local is the answer to a failure of this rank's work: a dump (the
// backend's first), the fail, a signal to the peers (the first, and not
// for a failure a peer is blamed for), then the policy.
func (u *Watchdog[W]) local(acts []Action[W], f *Failure[W]) []Action[W] {
	if i, ok := u.find(f.Work); ok {
		u.pending[i].failed = true
	}
	acts = u.dump(acts, f)
	acts = append(acts, Action[W]{Kind: Fail, Failure: f})
	if f.Kind != AsyncRemote && f.Kind != Remote {
		acts = u.signal(acts, f)
	}
	return u.policy(acts, f)
}

func (u *Watchdog[W]) dump(acts []Action[W], f *Failure[W]) []Action[W] {
	if !u.cfg.Dump || u.dumped {
		return acts
	}
	u.dumped = true
	return append(acts, Action[W]{Kind: Dump, Failure: f})
}

func (u *Watchdog[W]) signal(acts []Action[W], f *Failure[W]) []Action[W] {
	if !u.cfg.Signal || u.signalled {
		return acts
	}
	u.signalled = true
	return append(acts, Action[W]{Kind: Signal, Failure: f})
}

// policy appends what follows failure f: in blocking-wait mode an abort in
// the background; otherwise the Policy's actions.
func (u *Watchdog[W]) policy(acts []Action[W], f *Failure[W]) []Action[W] {
	if f == nil {
		return acts
	}
	if u.cfg.BlockingWait {
		return u.abort(acts, f, true)
	}
	switch u.cfg.Policy {
	case CleanUpOnly:
		acts = u.abort(acts, f, false)
	case TearDown:
		acts = u.abort(acts, f, false)
		acts = u.exit(acts, f)
	case SkipCleanUp:
		acts = u.exit(acts, f)
	}
	return acts
}

func (u *Watchdog[W]) abort(acts []Action[W], f *Failure[W], background bool) []Action[W] {
	if u.aborted {
		return acts
	}
	u.aborted = true
	u.failAll()
	return append(acts, Action[W]{Kind: Abort, Failure: f, Background: background})
}

func (u *Watchdog[W]) exit(acts []Action[W], f *Failure[W]) []Action[W] {
	u.exiting = true
	grace := time.Duration(0)
	if u.dumped {
		grace = u.cfg.DumpGrace
	}
	return append(acts, Action[W]{Kind: Fatal, Failure: f}, Action[W]{Kind: Exit, Code: 1, Grace: grace})
}

// failAll marks every pending work failed: an abort fails those that have
// not completed.
func (u *Watchdog[W]) failAll() {
	for i := range u.pending {
		u.pending[i].failed = true
	}
}
