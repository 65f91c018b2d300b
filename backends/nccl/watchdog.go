package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gocoll/gocoll/backend"
)

func abortComm(c *comm) {
	C.gn_comm_abort(C.uintptr_t(c.ctx), C.uintptr_t(c.handle))
}

// watchdog polls the pending works every WatchdogInterval: completions
// (releasing the events, and moving stashes of works never waited on to be
// released at the next op), timeouts, and NCCL's asynchronous errors. It
// never blocks on the device.
func (b *Backend) watchdog() {
	defer close(b.wdDone)
	t := time.NewTicker(b.opts.WatchdogInterval)
	defer t.Stop()
	var scratch []*Work
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		scratch = append(scratch[:0], b.pending...)
		b.mu.Unlock()
		if len(scratch) == 0 {
			continue
		}
		b.checkAsyncErrors(scratch)
		var freed []*Work
		now := time.Now()
		for _, w := range scratch {
			if w.poll() {
				freed = append(freed, w)
				continue
			}
			if now.Sub(w.enq) > w.timeout {
				err := &backend.OpError{Op: w.op.String(), Seq: w.seq, Rank: b.rank, Backend: Name, Kind: backend.ErrTimeout,
					Timeout: w.timeout, Detail: fmt.Sprintf("the watchdog saw it still running %v after enqueue (group %s)", now.Sub(w.enq).Round(time.Millisecond), b.cfg.GroupDesc)}
				w.fail(err)
				b.handleError(err)
			}
		}
		b.mu.Lock()
		b.pending = slices.DeleteFunc(b.pending, func(w *Work) bool { return w.finished.Load() })
		for _, w := range freed {
			w.mu.Lock()
			for _, r := range w.takeStash() {
				b.unstash = append(b.unstash, r)
			}
			w.mu.Unlock()
		}
		b.mu.Unlock()
		clear(scratch)
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
		for _, x := range ws {
			if x.c == w.c {
				x.fail(&backend.OpError{Op: x.op.String(), Seq: x.seq, Rank: b.rank, Backend: Name, Kind: kind, Err: err})
			}
		}
		b.handleError(err)
	}
}

// handleError applies the ErrorPolicy.
func (b *Backend) handleError(err error) {
	switch b.opts.ErrorPolicy {
	case NoHandling:
	case CleanUpOnly:
		b.abortErr.CompareAndSwap(nil, &err)
		b.abortComms(context.Background(), err)
	case TearDown:
		b.abortComms(context.Background(), err)
		b.fatal(err)
	case SkipCleanUp:
		b.fatal(err)
	}
}
