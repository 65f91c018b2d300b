// Package ucc is gocoll's backend over UCC, the Unified Collective
// Communication library of openucx (libucc.so.1), in the role of PyTorch's
// ProcessGroupUCC. The library is opened at run time (GOCOLL_UCC_LIBRARY,
// else the soname), so the package builds with Go and gcc alone; a process
// without libucc gets ErrUnavailable from New.
//
// Link it with a blank import; it registers itself as "ucc" for CPU
// tensors:
//
//	import _ "github.com/gocoll/gocoll/backends/ucc"
//
// Wire-up. One UCC library handle, context and team per group, made in
// UCC's order (library config, ucc_init_version, context config, context,
// team post, then team test with context progress). The out-of-band
// allgather that UCC wires up with runs over the group's store and never
// blocks (oob.go).
//
// Ops. The caller's goroutine turns an op into one or more UCC collectives
// and initialises and posts them, in issue order, under the backend's
// lock; an op UCC has no algorithm for fails there, synchronously, with
// ErrUnsupported. One goroutine per backend progresses the context
// (ucc_context_progress) while anything is pending and completes the
// works. UCC has no wake-up file descriptor, so the goroutine spins for
// Options.PollSpin after the last completion, then sleeps between rounds
// with a doubling sleep up to Options.MaxPark, naps for 50 ms after the
// last op and then blocks outright until a submit kicks it (submits do not
// kick while it naps): an idle group costs no CPU (PyTorch's ProcessGroupUCC
// polls a core at 100 % for the life of the group). A goroutine blocked in
// Wait progresses the context itself, as a C program's test loop does, for
// up to a second (drive.go), and the progress goroutine keeps out of its
// way: while callers drive (one does now, or one did since its last look)
// it neither progresses nor spins, naps MaxPark at a time, and is not
// kicked when a waiter leaves work pending; it takes over within two naps
// once no caller drives. The hand-off and the timer sleeps made a small
// allreduce several times slower than raw libucc, and a kick per Wait
// (with the spin it set off) made a 1 MiB one 40 % slower on two cores.
//
// Deadlines and failures. UCC's own collective timeout is not used: it is
// unreliable (an allreduce posted alone returned OK untouched, or never
// returned). The progress goroutine drives a watch.Watchdog: an op past its
// timeout (Meta.Timeout, from issue) fails with ErrTimeout naming the ranks
// that never issued it (Config.Desync), after the flight recorder dump.
// UCC cannot cancel a posted collective: the request stays posted, its
// buffers stay pinned, and the goroutine finalises it if it ever completes
// (a late peer's op does complete it), discarding its result.
//
// Abort. UCC has no abort either. Abort fails every pending work at once
// with ErrAborted wrapping the reason, tells the peers through the store
// (their pending works fail with ErrRemote naming this rank), stops the
// progress goroutine, and makes later ops fail with ErrAborted keeping the
// reason. What UCC holds then — the library handle, context, team, the
// requests still posted, the host buffers they point into and the C memory
// of small ops (small.go) — stays
// allocated until the process exits. Close waits (bounded by its ctx) for
// the pending works, then destroys team, context and library when no
// request is left posted, and leaves them allocated otherwise; it never
// hangs.
//
// Point to point. UCC has no send and recv; as PyTorch's ProcessGroupUCC
// does, Send and Recv are broadcasts over the two-rank active set of the
// peers, with the user tag (0 to 32759) in UCC's tag field (p2p.go).
// RecvAnysource returns ErrUnsupported: a UCC broadcast names its root when
// posted and cannot be cancelled. MonitoredBarrier runs over the group's
// store, not UCC, so that a hung collective cannot hold it back.
//
// Narrow floats. UCC 1.9's CPU float16 sums are wrong and it has no float8
// types: reductions of float16 and the float8 types widen to float32 in
// scratch, reduce in float32 with UCC and round back once at the end.
package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/internal/stage/cudastage"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// Name is the registered backend name.
const Name = "ucc"

// remoteErrorKey is the key, in the group's store, under which a rank that
// aborts writes watch.SignalValue; the peers' pending works then fail with
// ErrRemote naming it, as nccl's remote_error signal does.
const remoteErrorKey = "ucc/remote_error"

// The progress goroutine's periods while works are pending.
const (
	tickEvery   = 20 * time.Millisecond  // the watchdog's Tick
	remoteEvery = 200 * time.Millisecond // a read of remoteErrorKey
	// idleLinger is how long the progress goroutine naps (Options.MaxPark
	// at a time) after the last pending op before it blocks outright:
	// a loop of ops then costs no kick per op, an idle group no CPU.
	idleLinger  = 50 * time.Millisecond
	storeBound  = 2 * time.Second // each store call of the backend
	abortBound  = time.Second     // Abort's publication to the peers
	destroyWait = 2 * time.Second // Close's wait for ucc_team_destroy
)

func init() {
	// CUDA tensors are staged through pinned host memory on an internal
	// stream (internal/stage): Debian's UCC has no CUDA components.
	backend.Register(backend.Driver{Name: Name, Devices: []tensor.DeviceType{tensor.CPU, tensor.CUDA},
		New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
			b, err := New(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return cudastage.Wrap(b, cfg)
		}})
}

// Backend is the ucc backend of one group.
type Backend struct {
	backend.Unimplemented

	cfg  backend.Config
	opts Options
	args backend.HostChecker[reduction] // the ops' common argument checks
	reds wholeReds                      // allreduceOne's reductions (ops.go)
	oob  *oob
	oobH cgo.Handle

	lib, ctx, team C.uintptr_t

	// mu orders the UCC calls (init, post, progress, test, finalize) and
	// guards pending, stopped and wd.
	mu      sync.Mutex
	pending []*work // posted, not yet finished by UCC, in post order
	// recs is the pool of op records (work.go): a record comes back once
	// its op has left UCC, so a small op allocates only its handle (and
	// that from a chunk, handleChunk).
	recs sync.Pool
	// handles are the handles given back by Release (work.go), zeroed;
	// holds counts the pending barriers that hold handles of earlier ops
	// (work.deps), during which Release keeps none.
	handles  sync.Pool
	released atomic.Bool // Release put a handle in handles since newWork found it empty
	holds    atomic.Int32
	stopped  error // ErrClosed or the abort error; later ops fail with it
	wd       *watch.Watchdog[*work]
	fp       *fpGate   // the fingerprint check (fingerprint.go); nil when off
	small    smallSlab // C memory for small ops (small.go)

	// driving counts the goroutines progressing UCC from Wait (drive.go);
	// posting counts the other goroutines waiting for mu (lockOut: a
	// submit, the watchdog, Abort, Close), which the drivers let in.
	driving, posting atomic.Int32
	// drives counts the drive and submit calls ever made: the progress goroutine
	// reads it once per nap to tell whether callers drive UCC (it then
	// keeps out of the way) or have stopped (it then takes over); no
	// caller has to kick it (drive.go).
	drives atomic.Uint32
	// napping is set while the progress goroutine sleeps on a timer:
	// submits do not kick it then (wake).
	napping atomic.Bool
	// npending is len(pending), for the progress goroutine to read
	// without taking mu while a driver holds it.
	npending atomic.Int32

	// rounds counts gu_drive calls and submits, and lastResched is when
	// a caller last passed through the Go scheduler (drive.go's
	// reschedEvery, reschedDueLocked); mu.
	rounds      uint32
	lastResched time.Time

	// yield is Options.Yield resolved: drivers give their core away
	// between progress rounds (1), as C's gu_drive takes it, and the
	// progress goroutine does not spin.
	yield C.int

	kick chan struct{} // wakes the progress goroutine; capacity 1
	stop chan struct{} // closed by Close and Abort
	done chan struct{} // closed when the progress goroutine has returned
	once sync.Once
}

var _ backend.Backend = (*Backend)(nil)

// New is the backend.Factory of ucc: it loads libucc, resolves the options
// and wires the group's UCC context and team up over cfg.Store.
func New(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
	o, err := optionsOf(cfg.Options)
	if err != nil {
		return nil, err
	}
	opts, err := resolveOptions(o, cfg.Timeout, knob.OS)
	if err != nil {
		return nil, err
	}
	if err := Load(); err != nil {
		return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: Name, Kind: backend.ErrUnavailable, Err: err}
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: ucc: the group has no store to wire UCC up over", backend.ErrInvalidArgument)
	}
	b := &Backend{cfg: cfg, opts: opts, args: hostChecker(cfg.Rank), reds: newWholeReds(), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		wd: watch.NewWatchdog[*work](watch.Config{Policy: watch.NoHandling, Rank: cfg.Rank, Dump: cfg.DumpAll != nil})}
	if yields(opts.Yield, cfg.WorldSize, runtime.NumCPU(), knob.OS) {
		b.yield = 1
	}
	b.oob = &oob{st: cfg.Store, rank: cfg.Rank, size: cfg.WorldSize, timeout: storeBound,
		deadline: time.Now().Add(opts.ConnectTimeout)}
	if dl, ok := ctx.Deadline(); ok && dl.Before(b.oob.deadline) {
		// The caller's deadline (Init's, which its barrier shares) ends
		// the out-of-band allgather too, which UCC runs inside one call.
		b.oob.deadline = dl
	}
	b.oobH = cgo.NewHandle(b.oob)
	b.small = newSmallSlab()
	if err := b.wireUp(ctx); err != nil {
		// What UCC made stays: its destroy calls need the peers' progress.
		return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: Name, Kind: backend.ErrUnavailable, Err: err}
	}
	if err := b.fpSetup(ctx); err != nil {
		return nil, &backend.OpError{Op: "init", Rank: cfg.Rank, Backend: Name, Kind: backend.ErrUnavailable, Err: err}
	}
	go b.progress()
	return b, nil
}

// wireUp makes the library handle, the context and the team.
func (b *Backend) wireUp(ctx context.Context) error {
	n, r := C.uint32_t(b.cfg.WorldSize), C.uint32_t(b.cfg.Rank)
	if err := result("ucc_init_version", C.gu_lib_init(&b.lib)); err != nil {
		return err
	}
	// ucc_context_create runs the out-of-band allgather to its end; the
	// test callback bounds it by ConnectTimeout.
	if err := result("ucc_context_create", C.gu_context_create(b.lib, C.uintptr_t(b.oobH), n, r, &b.ctx)); err != nil {
		return err
	}
	if err := result("ucc_team_create_post", C.gu_team_create_post(b.ctx, C.uintptr_t(b.oobH), n, r, &b.team)); err != nil {
		return err
	}
	park := time.Microsecond
	for {
		st := C.gu_team_create_test(b.team)
		if st == statusOK {
			return nil
		}
		if st != statusInProgress {
			return result("ucc_team_create_test", st)
		}
		C.gu_context_progress(b.ctx)
		if time.Now().After(b.oob.deadline) {
			return fmt.Errorf("ucc: the team of %d ranks was not complete after %v (ucc.Options.ConnectTimeout)", b.cfg.WorldSize, b.opts.ConnectTimeout)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ucc: team creation: %w", err)
		}
		time.Sleep(park)
		park = min(2*park, 5*time.Millisecond)
	}
}

// now is the time on backend.Mono's clock: works keep their times as
// durations on it, one read of the monotonic clock each (time.Now reads
// the wall clock too: on a VM each read is a good part of a small op),
// and it is the clock of Meta.Issued, which saves an op's issue its read.
func (b *Backend) now() time.Duration { return backend.Mono() }

// issued is op m's issue time on now's clock: the dispatcher's reading
// (Meta.Issued) when it made one, else the clock now. Why: through the
// dispatcher (its flight recorder is on by default) the clock was read
// for the op already, and a second read is ~40-80 ns of an 8 B allreduce
// that the raw libucc loop runs in about a microsecond.
func (b *Backend) issued(m backend.Meta) time.Duration {
	if m.Issued != 0 {
		return m.Issued
	}
	return b.now()
}

// Name implements backend.Core.
func (b *Backend) Name() string { return Name }

// Capabilities implements backend.Core. Every dtype moves (as bytes) and
// reduces (float16 and float8 through float32). Send and Recv work;
// RecvAnysource fails with ErrUnsupported (UCC broadcasts name their root
// when posted and cannot be cancelled), which Capabilities has no field
// for.
func (b *Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Devices:           []tensor.DeviceType{tensor.CPU},
		DTypes:            tensor.DTypes(),
		BitwiseReductions: true,
		Timing:            true,
		UnevenSizes:       true,
		MismatchChecks:    b.opts.Fingerprints != FingerprintsOff,
	}
}

// Rank implements backend.Core.
func (b *Backend) Rank() int { return b.cfg.Rank }

// Size implements backend.Core.
func (b *Backend) Size() int { return b.cfg.WorldSize }

// Options returns the options in effect, defaults filled in.
func (b *Backend) Options() Options { return b.opts }

// Close implements backend.Core: it waits (bounded by ctx) for the pending
// works, stops the progress goroutine and, when UCC holds no posted
// request, destroys the team, the context and the library handle.
func (b *Backend) Close(ctx context.Context) error {
	b.lockOut()
	if b.stopped != nil {
		b.mu.Unlock()
		return nil
	}
	b.stopped = &backend.OpError{Op: "close", Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrClosed}
	works := b.pendingHandlesLocked()
	b.mu.Unlock()
	var err error
	for _, w := range works {
		if werr := w.WaitHost(ctx); werr != nil && ctx.Err() != nil {
			err = fmt.Errorf("ucc: close: %w", ctx.Err())
			break
		}
	}
	b.halt()
	b.lockOut()
	defer b.mu.Unlock()
	if len(b.pending) > 0 {
		// Requests still posted (an op whose peer never came): UCC cannot
		// cancel them, so what they point at stays until the process exits.
		slog.Warn("gocoll ucc: close: collectives still posted; the UCC context and team stay allocated until exit",
			"rank", b.cfg.Rank, "group", b.cfg.GroupDesc, "posted", len(b.pending))
		return err
	}
	deadline := time.Now().Add(destroyWait)
	for {
		st := C.gu_team_destroy(b.team)
		if st == statusOK {
			break
		}
		if st != statusInProgress || time.Now().After(deadline) {
			slog.Warn("gocoll ucc: close: ucc_team_destroy did not finish; the context stays allocated until exit",
				"rank", b.cfg.Rank, "status", int(st))
			return err
		}
		C.gu_context_progress(b.ctx)
		time.Sleep(100 * time.Microsecond)
	}
	b.fpCloseLocked()
	b.freeSmallLocked()
	C.gu_context_destroy(b.ctx)
	C.gu_finalize(b.lib)
	b.oobH.Delete()
	return err
}

// Abort implements backend.Core; see the package documentation.
func (b *Backend) Abort(ctx context.Context, reason error) error {
	if reason == nil {
		reason = errors.New("abort requested")
	}
	aerr := &backend.OpError{Op: "abort", Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrAborted, Err: reason}
	b.lockOut()
	if b.stopped == nil || errors.Is(b.stopped, backend.ErrClosed) {
		b.stopped = aerr
	}
	// Handles, not records: a record that leaves UCC once b.mu is
	// released goes back to the pool.
	works := b.pendingHandlesLocked()
	b.wd.Abort()
	b.mu.Unlock()
	for _, w := range works {
		w.fail(&backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrAborted, Err: reason})
	}
	b.halt()
	pctx, cancel := context.WithTimeout(ctx, abortBound)
	defer cancel()
	// The peers blame the rank the reason blames (a dead or late peer this
	// rank gives up because of), not this rank, which is only following.
	root, msg := b.cfg.Rank, aerr.Error()
	if r, ok := backend.RootCause(reason, b.cfg.Rank); ok {
		root, msg = r, fmt.Sprintf("rank %d aborted because of rank %d: %s", b.cfg.Rank, r, msg)
	}
	v := watch.SignalValue(root, time.Now(), msg)
	if err := b.cfg.Store.Set(pctx, remoteErrorKey, []byte(v)); err != nil {
		slog.Warn("gocoll ucc: abort: could not tell the peers", "rank", b.cfg.Rank, "group", b.cfg.GroupDesc, "err", err)
	}
	return nil
}

// halt stops the progress goroutine and waits for it.
func (b *Backend) halt() {
	b.once.Do(func() { close(b.stop) })
	<-b.done
}

// usable returns the error of an op issued after Close or Abort.
func (b *Backend) usableLocked(op backend.Op, seq uint64) error {
	if b.stopped == nil {
		return nil
	}
	kind := backend.ErrClosed
	if errors.Is(b.stopped, backend.ErrAborted) {
		kind = backend.ErrAborted
	}
	return &backend.OpError{Op: op.String(), Seq: seq, Rank: b.cfg.Rank, Backend: Name, Kind: kind, Err: b.stopped}
}

// wake kicks the progress goroutine when it is blocked for want of work.
// While it naps on a timer (napping) it is not kicked: it looks again
// within Options.MaxPark anyway, and a kick per op is a thread wake-up per
// op, which on a loaded machine costs more than the small op itself and
// takes a core from the rank the op waits for. A caller that waits drives
// its op at once (drive.go).
func (b *Backend) wake() {
	if b.napping.Load() {
		return
	}
	b.kickNow()
}

// kickNow kicks the progress goroutine even while it naps.
func (b *Backend) kickNow() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// progress is the backend's progress goroutine; see the package
// documentation for its spin, back-off and park.
func (b *Backend) progress() {
	defer close(b.done)
	var lastDone, lastTick, lastRemote, lastBusy time.Time
	var seenDrives uint32
	park := time.Microsecond
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// nap waits for d, a kick or the stop; it reports false on the stop.
	nap := func(d time.Duration) (kicked, ok bool) {
		b.napping.Store(true)
		defer b.napping.Store(false)
		timer.Reset(d)
		select {
		case <-b.stop:
			timer.Stop()
			return false, false
		case <-b.kick:
			timer.Stop() // Go ≥ 1.23: no stale tick to drain
			return true, true
		case <-timer.C:
			return false, true
		}
	}
	for {
		if b.npending.Load() == 0 {
			if time.Since(lastBusy) < idleLinger {
				// Ops came lately: nap rather than block, so that the
				// next submits need not kick.
				if _, ok := nap(b.opts.MaxPark); !ok {
					return
				}
				continue
			}
			select {
			case <-b.stop:
				return
			case <-b.kick:
			}
			lastBusy, lastDone, park = time.Now(), time.Now(), time.Microsecond
			seenDrives = b.drives.Load() // drives before the block are no callers now
			continue
		}
		now := time.Now()
		lastBusy = now
		// Callers driving UCC from Wait now, or since the last look:
		// leave UCC to them, neither progress nor spin, and look again
		// in MaxPark. Why: in a loop of issue and Wait (every training
		// step, conftest bench) the waiter progresses every op itself,
		// and this goroutine stepping in between two Waits (it was
		// kicked at each Wait's end and spun PollSpin) ran a third busy
		// thread beside the two ranks of a two-core machine: ~1500
		// context switches per 100 ms per rank against the raw loop's
		// ~150, and a 1 MiB allreduce 40 % slower than raw libucc. An op
		// left pending when the callers stop (issued, never waited for)
		// is progressed here within two naps (2 x MaxPark).
		drives := b.drives.Load()
		callers := b.driving.Load() > 0 || drives != seenDrives
		seenDrives = drives
		if !callers {
			// A goroutine in Wait progresses UCC itself; a second caller
			// of ucc_context_progress would only contend for b.mu.
			b.mu.Lock()
			C.gu_context_progress(b.ctx)
			b.fpStuckLocked()
			finished := b.reapLocked()
			b.mu.Unlock()
			if finished > 0 {
				lastDone, park = now, time.Microsecond
			}
		}
		if now.Sub(lastTick) >= tickEvery {
			lastTick = now
			b.lockOut()
			b.watchLocked()
			b.wd.Retire(func(w *work) bool { return w.IsCompleted() })
			acts := b.wd.Tick(now)
			b.mu.Unlock()
			b.perform(acts)
		}
		if now.Sub(lastRemote) >= remoteEvery {
			lastRemote = now
			b.checkRemote()
		}
		if !callers && b.yield == 0 && b.opts.PollSpin >= 0 && now.Sub(lastDone) < b.opts.PollSpin {
			continue
		}
		d := park
		if callers {
			d = b.opts.MaxPark
		}
		kicked, ok := nap(d)
		if !ok {
			return
		}
		if kicked {
			park = time.Microsecond
		} else {
			park = min(2*park, b.opts.MaxPark)
		}
	}
}

// watchLocked hands the watchdog the pending works it does not watch yet:
// those that outlived the last tick (submit leaves them out, so that an op
// that finishes within a tick costs the watchdog nothing). Their issue
// time is kept, so their timeouts count from issue.
func (b *Backend) watchLocked() {
	b.fpTickLocked()
	for _, w := range b.pending {
		if !w.watched && w.m.Timeout > 0 && !w.IsCompleted() {
			b.wd.Enqueue(w, "team", backend.MonoTime(w.h.enq), w.m.Timeout)
			w.watched = true
		}
	}
}

// reapLocked tests the pending works' requests, finalises what UCC has
// finished and completes those works. It returns how many it finished.
func (b *Backend) reapLocked() int {
	b.fpStepLocked()
	n := 0
	live := b.pending[:0]
	for _, w := range b.pending {
		if w.testLocked(false) {
			n++
			continue
		}
		live = append(live, w)
	}
	clear(b.pending[len(live):])
	b.pending = live
	b.npending.Store(int32(len(live)))
	return n
}

// checkRemote reads the remote-error key when a peer's abort could fail a
// pending work, and feeds it to the watchdog.
func (b *Backend) checkRemote() {
	b.lockOut()
	want := b.wd.WantsRemote()
	b.mu.Unlock()
	if !want {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeBound)
	defer cancel()
	v, ok := store.TryGet(ctx, b.cfg.Store, remoteErrorKey)
	if !ok {
		return
	}
	b.lockOut()
	acts := b.wd.RemoteSignal(string(v))
	b.mu.Unlock()
	b.perform(acts)
}

// perform carries out the watchdog's actions. The policy is NoHandling, so
// they are dumps and fails; a user's Abort does its own work.
func (b *Backend) perform(acts []watch.Action[*work]) {
	errs := watch.Errors[*work, *backend.OpError]{Build: b.failureError}
	for _, a := range acts {
		switch a.Kind {
		case watch.Dump:
			e := errs.Of(a.Failure)
			if path := b.cfg.DumpAll(e.Error()); path != "" {
				e.Detail += "; flight recorder dump: " + path
			}
		case watch.Fail:
			e := errs.Of(a.Failure)
			slog.Error("gocoll ucc: op failed", "group", b.cfg.GroupDesc, "rank", b.cfg.Rank, "seq", a.Failure.Work.m.Seq,
				"op", a.Failure.Work.op.String(), "err", e)
			a.Failure.Work.fail(e)
		}
	}
}

// failureError builds the error of a failure the watchdog decided.
func (b *Backend) failureError(f *watch.Failure[*work]) *backend.OpError {
	w := f.Work
	e := &backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name}
	switch f.Kind {
	case watch.Remote:
		e.Kind, e.Ranks = backend.ErrRemote, []int{f.Peer}
		e.Detail = fmt.Sprintf("rank %d failed: %s", f.Peer, f.Message)
		return e
	case watch.Timeout:
	default:
		e.Kind, e.Err = backend.ErrAborted, f.Cause
		return e
	}
	e.Kind, e.Timeout = backend.ErrTimeout, w.m.Timeout
	var parts []string
	if b.cfg.Desync != nil && w.m.Seq > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), storeBound)
		late, sentence := b.cfg.Desync(ctx, w.op, w.m.Seq)
		cancel()
		e.Ranks = late
		if sentence != "" {
			parts = append(parts, sentence)
		}
	}
	if ranks, sentence, held := b.fpTimeout(w, f.Elapsed); held {
		if len(e.Ranks) == 0 {
			e.Ranks = ranks
		}
		parts = append(parts, sentence)
	} else {
		parts = append(parts, fmt.Sprintf("the backend's watchdog saw it still running %v after issue (group %s); UCC cannot cancel it, so it stays posted",
			f.Elapsed.Round(time.Millisecond), b.cfg.GroupDesc))
	}
	e.Detail = strings.Join(parts, "; ")
	return e
}

// pendingHandlesLocked lists the handles of the pending ops. b.mu is held.
func (b *Backend) pendingHandlesLocked() []*handle {
	hs := make([]*handle, len(b.pending))
	for i, w := range b.pending {
		hs[i] = w.h
	}
	return hs
}
