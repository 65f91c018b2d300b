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
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
)

// remoteErrorKey is the key, in the group's store, under which a rank that
// fails writes "rank\nreason"; the other ranks' watchdogs fail their
// pending works with ErrRemote naming it (PyTorch's remote_error signal).
const remoteErrorKey = "nccl/remote_error"

// dumpGrace is how long a rank that ends the process after a failure waits
// after asking its peers to dump, so that their monitors (which poll the
// store every CoordCheck, 1 s by default) see the signal while this
// process, which may host the store, is still up.
const dumpGrace = 2 * time.Second

// storeCallTimeout bounds each store call of the watchdog (the desync
// report, the remote-error key).
const storeCallTimeout = 5 * time.Second

func abortComm(c *comm) {
	C.gn_comm_abort(C.uintptr_t(c.ctx), C.uintptr_t(c.handle))
}

// Heartbeat implements backend.Heartbeater: the number of watchdog rounds
// so far. The dispatcher's heartbeat monitor ends the process when it
// stands still for the heartbeat timeout.
func (b *Backend) Heartbeat() uint64 { return b.heartbeat.Load() }

var _ backend.Heartbeater = (*Backend)(nil)

// watchdog polls the pending works every WatchdogInterval: completions
// (releasing the events, and moving stashes of works never waited on to be
// released at the next op), NCCL's asynchronous errors, a peer's error
// published through the store, and timeouts; each round bumps the
// heartbeat. It never blocks on the device. In blocking-wait mode it only
// retires completions: Wait detects errors and timeouts in the caller.
func (b *Backend) watchdog() {
	defer close(b.wdDone)
	t := time.NewTicker(b.opts.WatchdogInterval)
	defer t.Stop()
	var scratch []*Work
	// Streams whose oldest pending work is still running this round. A
	// stream runs its work in order, so nothing behind that work can have
	// finished: one event query per busy stream, not one per pending work
	// (thousands when a loop issues faster than the GPU drains, and each
	// query contends with the issuing thread for the driver).
	busy := map[uintptr]bool{}
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		if b.opts.HangWatchdogForTest {
			<-b.stop // the heartbeat stands still from here on
			return
		}
		b.heartbeat.Add(1)
		b.mu.Lock()
		scratch = append(scratch[:0], b.pending...)
		b.mu.Unlock()
		if len(scratch) == 0 {
			continue
		}
		if !b.opts.BlockingWait {
			b.checkAsyncErrors(scratch)
			b.checkRemoteError(scratch)
		}
		var freed []*Work
		clear(busy)
		for _, w := range scratch {
			if h := w.stream.Handle(); !busy[h] {
				if w.poll() {
					freed = append(freed, w)
					continue
				}
				busy[h] = true
			}
			if b.opts.BlockingWait {
				continue
			}
			if d := time.Since(w.enq); d > w.timeout {
				err := w.timeoutError(fmt.Sprintf("the watchdog saw it still running %v after enqueue (group %s)", d.Round(time.Millisecond), b.cfg.GroupDesc))
				w.fail(err)
				b.onLocalFailure(err)
			}
		}
		b.mu.Lock()
		b.pending = slices.DeleteFunc(b.pending, func(w *Work) bool { return w.finished.Load() })
		for _, w := range freed {
			w.mu.Lock()
			b.unstash = append(b.unstash, w.takeStash()...)
			w.mu.Unlock()
		}
		b.mu.Unlock()
		clear(scratch)
	}
}

// timeoutError builds the ErrTimeout error of w: with the desync report
// (the late ranks and a sentence naming them) and the flight recorder dump
// that every rank is asked to take.
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
	b.dumpAll(err)
	return err
}

// dumpAll dumps the flight recorder and asks every peer to dump theirs,
// once per backend (the first failure is the one worth a dump), and adds
// the dump file to err's detail.
func (b *Backend) dumpAll(err *backend.OpError) {
	if b.cfg.DumpAll == nil || !b.dumped.CompareAndSwap(false, true) {
		return
	}
	if path := b.cfg.DumpAll(err.Error()); path != "" {
		err.Detail += "; flight recorder dump: " + path
	}
}

// onLocalFailure handles an error this rank found itself (a timeout, an
// async NCCL error other than a remote one): it tells the peers through
// the store and applies the error policy.
func (b *Backend) onLocalFailure(err error) {
	b.publishRemoteError(err)
	b.handleError(err)
}

// publishRemoteError writes the remote-error key, once per backend.
func (b *Backend) publishRemoteError(err error) {
	if b.cfg.Store == nil || !b.published.CompareAndSwap(false, true) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	v := fmt.Sprintf("%d\n%d\n%s", b.rank, time.Now().UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
	if e := b.cfg.Store.Set(ctx, remoteErrorKey, []byte(v)); e != nil {
		slog.Warn("gocoll nccl: could not publish the error to the peers", "rank", b.rank, "group", b.cfg.GroupDesc, "err", e)
	}
}

// checkRemoteError fails the pending works with ErrRemote when a peer has
// published an error since the last one seen, and applies the policy.
func (b *Backend) checkRemoteError(ws []*Work) {
	if b.cfg.Store == nil || !slices.ContainsFunc(ws, func(w *Work) bool { return !w.finished.Load() }) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	// Check before Get: a Get of a missing key blocks until it appears.
	if ok, err := b.cfg.Store.Check(ctx, remoteErrorKey); err != nil || !ok {
		return
	}
	v, err := b.cfg.Store.Get(ctx, remoteErrorKey)
	if err != nil || string(v) == b.remoteSeen {
		return
	}
	b.remoteSeen = string(v)
	parts := strings.SplitN(string(v), "\n", 3)
	if len(parts) != 3 {
		return
	}
	r, err := strconv.Atoi(parts[0])
	if err != nil || r == b.rank {
		return
	}
	var first error
	for _, w := range ws {
		if w.finished.Load() {
			continue
		}
		e := &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: backend.ErrRemote, Ranks: []int{r},
			Detail: fmt.Sprintf("rank %d failed: %s", r, parts[2])}
		w.fail(e)
		if first == nil {
			first = e
		}
	}
	if first != nil {
		b.handleError(first)
	}
}

// checkAsyncErrors asks each communicator with pending works for an
// asynchronous error (a peer or network failure) and fails its works.
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
		kind := backend.ErrAborted
		if st == ncclRemoteError {
			kind = backend.ErrRemote
		}
		var first *backend.OpError
		for _, x := range ws {
			if x.c == w.c && !x.finished.Load() {
				e := &backend.OpError{Op: x.op.String(), Seq: x.seq, Rank: b.rank, Backend: Name, Kind: kind, Err: err,
					Detail: fmt.Sprintf("NCCL reported an asynchronous error on communicator %s (group %s)", w.c.key, b.cfg.GroupDesc)}
				if first == nil {
					b.dumpAll(e)
					first = e
				}
				x.fail(e)
			}
		}
		if first == nil {
			continue
		}
		if kind == backend.ErrRemote {
			b.handleError(first) // a peer failed: it is not ours to publish
		} else {
			b.onLocalFailure(first)
		}
	}
}

// handleError applies the ErrorPolicy (never in blocking-wait mode, where
// Wait reports errors to the caller).
func (b *Backend) handleError(err error) {
	switch b.opts.ErrorPolicy {
	case NoHandling:
	case CleanUpOnly:
		b.abortErr.CompareAndSwap(nil, &err)
		b.abortAll(context.Background(), err)
	case TearDown:
		b.abortErr.CompareAndSwap(nil, &err)
		b.abortAll(context.Background(), err)
		b.fatal(err)
	case SkipCleanUp:
		b.fatal(err)
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
	b.mu.Lock()
	pend := slices.Clone(b.pending)
	b.mu.Unlock()
	for _, w := range pend {
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

// fatal ends the process after an unrecoverable error, as TearDown and
// SkipCleanUp do: one fatal log line, then, when peers were asked to dump,
// a short grace so that they see the signal, then exit status 1.
func (b *Backend) fatal(err error) {
	slog.Error("gocoll nccl: fatal: ending the process", "rank", b.rank, "group", b.cfg.GroupDesc, "policy", b.opts.ErrorPolicy.String(), "err", err)
	if b.dumped.Load() {
		time.Sleep(dumpGrace)
	}
	os.Exit(1)
}
