package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/watch"
	"github.com/gocoll/gocoll/store"
)

// remoteErrorKey is the key, in the group's store, under which a rank that
// fails writes "rank\nnanos\nreason" (watch.SignalValue); the other ranks'
// watchdogs fail their pending works with ErrRemote naming it (PyTorch's
// remote_error signal).
const remoteErrorKey = "nccl/remote_error"

// dumpGrace is how long a rank that ends the process after a failure waits
// after asking its peers to dump, so that their monitors (which poll the
// store every CoordCheck, 1 s by default) see the signal while this
// process, which may host the store, is still up.
const dumpGrace = 2 * time.Second

// storeCallTimeout bounds each store call of the watchdog (the desync
// report, the remote-error key).
const storeCallTimeout = 5 * time.Second

// edge is what the watchdog's driver needs from the world outside the
// decisions: the clock, a sleep and the process's exit. New wires the real
// ones; tests replace them.
type edge struct {
	now   func() time.Time
	sleep func(time.Duration)
	exit  func(code int)
}

var realEdge = edge{now: time.Now, sleep: time.Sleep, exit: os.Exit}

// policyOf converts the option to the watch unit's enum, by name (the
// option's numbering is PyTorch's, or whatever options.go makes it). A
// value that names no policy, such as a zero value that means "the
// default", is the default, SkipCleanUp.
func policyOf(p ErrorPolicy) watch.Policy {
	switch p {
	case NoHandling:
		return watch.NoHandling
	case TearDown:
		return watch.TearDown
	case CleanUpOnly:
		return watch.CleanUpOnly
	case SkipCleanUp:
		return watch.SkipCleanUp
	}
	return watch.SkipCleanUp
}

// newWatchdog is the decision unit of a backend with these options.
func newWatchdog(cfg backend.Config, opts Options) *watch.Watchdog[*Work] {
	return watch.NewWatchdog[*Work](watch.Config{
		Policy: policyOf(opts.ErrorPolicy), BlockingWait: opts.BlockingWait, Rank: cfg.Rank,
		Dump: cfg.DumpAll != nil, Signal: cfg.Store != nil, DumpGrace: dumpGrace,
	})
}

func abortComm(c *comm) {
	C.gn_comm_abort(C.uintptr_t(c.ctx), C.uintptr_t(c.handle))
}

// Heartbeat implements backend.Heartbeater: the number of watchdog rounds
// so far. The dispatcher's heartbeat monitor ends the process when it
// stands still for the heartbeat timeout.
func (b *Backend) Heartbeat() uint64 { return b.heartbeat.Load() }

var _ backend.Heartbeater = (*Backend)(nil)

// watchdog drives the backend's watch.Watchdog every WatchdogInterval: it
// feeds it NCCL's asynchronous errors, a peer's error published through
// the store, the completions it polls, and the time, and performs the
// actions it returns. Each round bumps the heartbeat. It never blocks on
// the device. In blocking-wait mode it only retires completions: Wait
// detects errors and timeouts in the caller.
func (b *Backend) watchdog() {
	defer close(b.wdDone)
	t := time.NewTicker(b.opts.WatchdogInterval)
	defer t.Stop()
	var scratch, freed []*Work
	var rel []cuda.Retainer
	// Streams whose oldest pending work is still running this round. A
	// stream runs its work in order, so nothing behind that work can have
	// finished: one event query per busy stream, not one per pending work
	// (thousands when a loop issues faster than the GPU drains, and each
	// query contends with the issuing thread for the driver).
	// Keyed by the *cuda.Stream, never its handle: the caller may destroy
	// its stream while works queued there are pending (Destroy zeroes the
	// handle, and the driver may hand the same handle to a new stream), and
	// two streams sharing a key would let one stream's completion retire
	// the other's running works and release their stashes early.
	busy := map[*cuda.Stream]bool{}
	// The newest pending work of each communicator and stream, and the
	// launch number up to which that stream is known done. When a loop
	// issues faster than the watchdog's period and the GPU keeps up, every
	// pending work is complete at each round: querying the newest one
	// retires all of them, where one query per work (thousands per round)
	// would contend with the issuing thread for the driver's locks.
	newest := map[laneKey]*Work{}
	doneTo := map[laneKey]uint64{}
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		if b.test.HangWatchdog {
			<-b.stop // the heartbeat stands still from here on
			return
		}
		b.heartbeat.Add(1)
		b.mu.Lock()
		b.flushAllLocked()
		scratch = b.wd.AppendPending(scratch[:0])
		b.retireLocked() // failed elsewhere (Work.Abort) since the last round
		b.mu.Unlock()
		if len(scratch) == 0 {
			continue
		}
		if !b.opts.BlockingWait {
			b.checkAsyncErrors(scratch)
			b.checkRemoteError()
		}
		freed = freed[:0]
		clear(busy)
		clear(newest)
		clear(doneTo)
		for _, w := range scratch {
			k := laneKey{w.c, w.stream}
			if n := newest[k]; n == nil || w.lseq > n.lseq {
				newest[k] = w
			}
		}
		for k, n := range newest {
			if n.poll() && n.isDone() {
				doneTo[k] = n.lseq
			}
		}
		for _, w := range scratch {
			if up, ok := doneTo[laneKey{w.c, w.stream}]; ok && w.lseq <= up {
				freed = append(freed, w)
				if w != newest[laneKey{w.c, w.stream}] {
					w.completeInOrder()
				}
				continue
			}
			if !busy[w.stream] {
				if w.poll() {
					freed = append(freed, w)
					continue
				}
				busy[w.stream] = true
			}
		}
		b.mu.Lock()
		b.retireLocked()
		acts := b.wd.Tick(b.edge.now())
		b.mu.Unlock()
		b.perform(context.Background(), acts, nil)
		b.mu.Lock()
		// The works failed this round leave too, their stashes kept: their
		// kernels may still run. The completed ones' stashes are released
		// at the next op.
		b.retireLocked()
		b.mu.Unlock()
		// Outside b.mu: a round can free a hundred thousand works, and
		// taking each one's lock under b.mu held every op's enqueue for
		// milliseconds. Wait may take the stash too; whoever comes first
		// (appendStash's swap) releases it.
		rel = rel[:0]
		for _, w := range freed {
			rel = w.appendStash(rel)
		}
		if len(rel) > 0 {
			b.mu.Lock()
			b.unstash = append(b.unstash, rel...)
			b.unstashed.Store(true)
			b.mu.Unlock()
			clear(rel)
		}
		clear(scratch)
		clear(freed)
	}
}

// laneKey is one communicator's launches on one stream: their launch
// numbers follow their order on the stream. The stream is the Work's
// *cuda.Stream (see busy in watchdog).
type laneKey struct {
	c      *comm
	stream *cuda.Stream
}

// retireLocked tells the unit which works have finished. b.mu is held.
func (b *Backend) retireLocked() {
	b.wd.Retire(finished)
}

func finished(w *Work) bool { return w.isFinished() }

// pendingWorks returns the works the watchdog watches.
func (b *Backend) pendingWorks() []*Work {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushAllLocked()
	return b.wd.AppendPending(nil)
}

// checkAsyncErrors asks each communicator with pending works for an
// asynchronous error (a peer or network failure) and feeds it to the unit.
func (b *Backend) checkAsyncErrors(ws []*Work) {
	seen := map[*comm]bool{}
	for _, w := range ws {
		if seen[w.c] || w.c.aborted.Load() {
			continue
		}
		seen[w.c] = true
		st, err := w.c.asyncError()
		if err == nil && (st == 0 || st == ncclInProgress) {
			continue
		}
		if err == nil {
			err = &Error{Call: "ncclCommGetAsyncError", Code: st, Detail: C.GoString(C.gn_last_error())}
		}
		b.mu.Lock()
		b.flushLocked(w.c) // every pending work of the communicator fails
		acts := b.wd.AsyncError(w.c.key, st == ncclRemoteError, err)
		b.mu.Unlock()
		b.perform(context.Background(), acts, nil)
	}
}

// checkRemoteError reads the remote-error key, when a peer's error could
// fail a pending work, and feeds it to the unit.
func (b *Backend) checkRemoteError() {
	b.mu.Lock()
	want := b.wd.WantsRemote()
	b.mu.Unlock()
	if b.cfg.Store == nil || !want {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	v, ok := store.TryGet(ctx, b.cfg.Store, remoteErrorKey)
	if !ok {
		return
	}
	b.mu.Lock()
	b.flushAllLocked()
	acts := b.wd.RemoteSignal(string(v))
	b.mu.Unlock()
	b.perform(context.Background(), acts, nil)
}

// perform carries out the unit's actions in order. Each failure's error is
// built once, at its first action (a dump comes before the fail, so that
// the error names the dump file before any waiter can see it). reason is
// the cause of an Abort with no failure (a user's Abort).
func (b *Backend) perform(ctx context.Context, acts []watch.Action[*Work], reason error) {
	if len(acts) == 0 {
		return
	}
	errs := watch.Errors[*Work, *backend.OpError]{Build: b.failureError}
	for _, a := range acts {
		switch a.Kind {
		case watch.Dump:
			e := errs.Of(a.Failure)
			if path := b.cfg.DumpAll(e.Error()); path != "" {
				e.Detail += "; flight recorder dump: " + path
			}
		case watch.Fail:
			e := errs.Of(a.Failure)
			slog.Error("gocoll nccl: op failed", "group", b.cfg.GroupDesc, "rank", b.rank, "seq", a.Failure.Work.seq,
				"op", a.Failure.Work.op.String(), "err", e)
			a.Failure.Work.fail(e)
		case watch.Signal:
			b.publishRemoteError(errs.Of(a.Failure))
		case watch.Abort:
			cause := reason
			if a.Failure != nil {
				cause = errs.Of(a.Failure)
			}
			b.abortErr.CompareAndSwap(nil, &cause)
			if a.Background {
				// The blocking waiter gets the error now; the abort
				// (bounded by AbortTimeout) goes on.
				go b.abortAll(context.Background(), cause)
			} else {
				b.abortAll(ctx, cause)
			}
		case watch.Fatal:
			attrs := []any{"rank", b.rank, "group", b.cfg.GroupDesc, "policy", b.opts.ErrorPolicy.String(), "err", errs.Of(a.Failure)}
			if a.Failure != nil && a.Failure.Work != nil {
				attrs = append(attrs, "seq", a.Failure.Work.seq, "op", a.Failure.Work.op.String())
			}
			slog.Error("gocoll nccl: fatal: ending the process", attrs...)
		case watch.Exit:
			if a.Grace > 0 {
				b.edge.sleep(a.Grace)
			}
			b.edge.exit(a.Code)
		}
	}
}

// failureError builds the error of a failure the unit decided; a timeout
// or an asynchronous error carries the NVML snapshot of the op's GPU
// (nvml.go).
func (b *Backend) failureError(f *watch.Failure[*Work]) *backend.OpError {
	err := b.failureErrorOf(f)
	if f.Kind != watch.Remote {
		b.addGPUSnapshot(err, f.Work)
	}
	return err
}

func (b *Backend) failureErrorOf(f *watch.Failure[*Work]) *backend.OpError {
	w := f.Work
	switch f.Kind {
	case watch.Timeout:
		who := "the watchdog"
		if f.Blocking {
			who = "blocking wait"
		}
		return w.timeoutError(fmt.Sprintf("%s saw it still running %v after enqueue (group %s)", who, f.Elapsed.Round(time.Millisecond), b.cfg.GroupDesc))
	case watch.Remote:
		return &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: backend.ErrRemote, Ranks: []int{f.Peer},
			Detail: fmt.Sprintf("rank %d failed: %s", f.Peer, f.Message)}
	}
	kind := backend.ErrAborted
	if f.Kind == watch.AsyncRemote {
		kind = backend.ErrRemote
	}
	detail := fmt.Sprintf("NCCL reported an asynchronous error on communicator %s (group %s)", f.Comm, b.cfg.GroupDesc)
	if f.Blocking {
		detail = "NCCL reported an asynchronous error (blocking wait)"
	}
	return &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: kind, Err: f.Cause, Detail: detail}
}

// timeoutError builds the ErrTimeout error of w, with the desync report
// (the late ranks and a sentence naming them). The dump file is added by
// the unit's Dump action, when this is the failure worth a dump.
func (w *Work) timeoutError(what string) *backend.OpError {
	b := w.b
	err := &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: backend.ErrTimeout, Timeout: w.timeout}
	var parts []string
	if b.cfg.Desync != nil && w.op.Info().Kind != backend.P2P && w.seq > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
		late, sentence := b.cfg.Desync(ctx, w.op, w.seq)
		cancel()
		err.Ranks = late
		if sentence != "" {
			parts = append(parts, sentence)
		}
	}
	parts = append(parts, what)
	err.Detail = strings.Join(parts, "; ")
	return err
}

// publishRemoteError writes the remote-error key (the unit asks once per
// backend).
func (b *Backend) publishRemoteError(err error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	// A failure that blames one peer (a timeout naming the late rank)
	// names that peer, so that the ranks that read the key blame it and
	// not this rank, which only found it.
	root, msg := b.rank, err.Error()
	if r, ok := backend.RootCause(err, b.rank); ok {
		root, msg = r, fmt.Sprintf("rank %d failed because of rank %d: %s", b.rank, r, msg)
	}
	v := watch.SignalValue(root, b.edge.now(), msg)
	if e := b.cfg.Store.Set(ctx, remoteErrorKey, []byte(v)); e != nil {
		slog.Warn("gocoll nccl: could not publish the error to the peers", "rank", b.rank, "group", b.cfg.GroupDesc, "err", e)
	}
}

// abortAll aborts every communicator of the group at once, each
// ncclCommAbort on its own thread, and waits for them at most
// AbortTimeout (or until ctx ends): an abort that hangs (NCCL's proxy
// join, a peer that never answers) is left behind, never waited on. Then
// it fails every pending work with ErrAborted wrapping reason.
func (b *Backend) abortAll(ctx context.Context, reason error) {
	// Fail the works still running first: ncclCommAbort ends their kernels,
	// and their end events then complete, which must not read as success
	// (seen on two H200s: a waiter saw nil). A work found complete here
	// finished before the abort and keeps its result.
	for _, w := range b.pendingWorks() {
		if !w.poll() {
			w.fail(&backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: backend.ErrAborted, Err: reason})
		}
	}
	done := make(chan string, maxDevices)
	var left []string
	for _, c := range b.comms() {
		if c.aborted.Swap(true) {
			continue
		}
		left = append(left, c.key)
		go func() {
			abortComm(c)
			done <- c.key
		}()
	}
	timer := time.NewTimer(b.opts.AbortTimeout)
	defer timer.Stop()
wait:
	for len(left) > 0 {
		select {
		case k := <-done:
			left = slices.DeleteFunc(left, func(s string) bool { return s == k })
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	if len(left) > 0 {
		slog.Warn("gocoll nccl: ncclCommAbort has not returned; going on without it", "rank", b.rank, "group", b.cfg.GroupDesc,
			"communicators", left, "waited", b.opts.AbortTimeout)
	}
}
