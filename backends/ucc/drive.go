package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"runtime"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
)

// waitDrive bounds how long a goroutine blocked in Wait progresses UCC
// itself before it leaves the work to the progress goroutine and blocks:
// long enough for the largest collectives of a healthy group (a 64 MiB
// allreduce takes tens of milliseconds on host memory), short enough that a
// Wait on a peer that never comes does not hold a core for the op's whole
// timeout.
const waitDrive = time.Second

// driveSpin bounds one gu_drive call, during which the driver holds b.mu
// and cannot see ctx: short against any deadline, long against the cost
// of a round trip through Go (a cgo crossing, the lock, the reap).
const driveSpin = 20 * time.Microsecond

// driveSlice bounds the later gu_drive calls of an op that outlived its
// first slice (driveSpin): a large op, which C then drives for up to
// driveSlice per crossing. Why: each return to Go (the reap of every
// pending work, TryLock, a crossing per work) is time this rank does not
// progress UCC, and at 4 ranks a 1 MiB allreduce (350 µs, ~17 slices of
// driveSpin) waits on every rank's progress at each of its steps; the raw
// loop never leaves C. What a long slice would hold up sees it: a
// submit, the progress goroutine's watchdog round, Abort and Close raise
// b.posting (lockOut), which ends the slice at once; a second goroutine
// in Wait (b.driving > 1) ends it after driveSpin, as before; ctx and
// waitDrive are looked at after every long slice. Why not longer: the
// other pending works (not the one waited for) are reaped in Go, between
// slices, so an earlier op's completion (its Future, IsCompleted) can lag
// UCC's by up to a slice.
const driveSlice = 250 * time.Microsecond

// reschedEvery is how often a goroutine that calls into UCC without
// blocking (a driver, or a caller whose small ops complete in their
// submit) passes through the Go scheduler (runtime.Gosched, checked every
// 128 gu_drive calls or submits: reschedDueLocked). Why: a goroutine that
// never blocks keeps its P's schedule tick, and every 10 ms the runtime's
// sysmon then retakes the P from under the cgo call and falls back to
// polling every 20 µs, thousands of thread wake-ups a second that each
// take a core from a spinning rank; a pass through the scheduler every
// 5 ms keeps sysmon asleep. The submit counts too: at two ranks most 8 B
// ops complete inside their submit (its progress round finds the peer's
// data there), and a rank whose ops all do never enters a drive; a loop
// of one cgo crossing per op then took 1.7–2.2 µs per op against
// 1.05–1.1 with the pass (the raw libucc loop: 0.9), BenchmarkTwoRanks8B's
// raw-each on the dev machine.
const reschedEvery = 5 * time.Millisecond

// drive progresses the context from the waiting goroutine until w leaves
// UCC, ctx ends, waitDrive passes or the backend stops, as the raw
// post/test/progress loop of a C program (and a blocking MPI call) does.
//
// Why: the progress goroutine's hand-off costs a goroutine wake-up per op
// (several µs on a loaded machine, where the raw loop takes 1 µs at 8 B),
// and its back-off sleeps are Go timers, which the runtime rounds up to a
// millisecond when the process is otherwise idle: a 1 MiB allreduce that
// UCC finishes in 0.2 ms took 2.4 ms. While a caller waits, nothing is
// gained by parking, so the caller polls; the progress goroutine steps
// back (no progress, no spinning while callers drive, see progress) and
// still runs the watchdog, so timeouts and peer aborts fail the work and
// end the loop.
//
// The lock is taken with TryLock and never while a submit waits for it
// (b.posting), so a driver never starves another goroutine's issue.
//
// It returns when it began to read the clock (63 rounds in, at most about
// a millisecond after the call), or the zero time when w finished before.
func (b *Backend) drive(ctx context.Context, h *handle) (start time.Time) {
	b.driving.Add(1)
	b.drives.Add(1)
	// No kick on the way out, even when work is left pending: the
	// progress goroutine takes over once no caller has driven for a nap
	// of MaxPark (backend.go's progress). A kick here is a thread
	// wake-up per Wait in a loop of issue and Wait, and the goroutine it
	// woke spun beside the caller's next op: a third busy thread where
	// every core runs a rank.
	defer b.driving.Add(-1)
	// The clock (start) is read only once the op has taken a while
	// (n == 63): a small op is done in the first gu_drive, and a clock
	// read is a good part of its cost.
	//
	// gu_drive stops when a submit waits for b.mu: it reads b.posting
	// (an int32 with no Go pointers around it) while it spins.
	stop := (*C.int32_t)(unsafe.Pointer(&b.posting))
	drivers := (*C.int32_t)(unsafe.Pointer(&b.driving))
	spin := driveSpin
	for n := 0; !h.IsCompleted(); n++ {
		if n&63 == 63 || spin > driveSpin {
			if start.IsZero() {
				start = time.Now()
			}
			if ctx.Err() != nil || time.Since(start) > waitDrive {
				return
			}
		}
		if b.posting.Load() == 0 && b.mu.TryLock() {
			// A stopped backend's context may be gone (Close destroys it
			// once nothing is pending; Abort leaves it to the process).
			live := len(b.pending) > 0 && (b.stopped == nil || errors.Is(b.stopped, backend.ErrClosed))
			// The op's record, while it is in the check or UCC (nil once
			// it went back to the pool, or for an op without one).
			w := h.rec
			// Not in UCC yet (held for its peers' fingerprints): this loop
			// spins in Go, where gu_drive's yield does not reach.
			held := live && (w == nil || w.live == 0)
			if live {
				if w != nil && w.live > 0 {
					// The C loop of a blocking caller, for up to driveSpin:
					// progress and test without a cgo crossing per round.
					// With an op held for its peers' fingerprints behind
					// it, the loop also watches for them (fpWatchLocked).
					slots, nslots, tag := b.fpWatchLocked()
					// And the peers' slots of the next op posted ahead of its
					// check, which C looks at while it spins (fpVerifyWatchLocked).
					v, nv := b.fpVerifyWatchLocked()
					w.live = int(C.gu_drive(b.ctx, &w.reqs[0], C.int(len(w.reqs)), &w.cerr, stop, drivers, C.int64_t(spin), C.int64_t(driveSpin),
						b.yield, slots, nslots, tag, v.slots, nv, v.tag, v.w1, v.w2, v.verdict))
					if nv > 0 {
						b.fpVerifiedLocked()
					}
					w.noteErr()
					if w.live > 0 {
						spin = driveSlice // it outlived a slice: a large op
						b.fpStuckLocked()
					}
				} else if w != nil && b.fp != nil && b.fpDriveLocked(w, stop) {
					// Held for its peers' fingerprints: the look at the
					// board, the start and the drive in C (fpfast.go).
					held = false // gu_fp_drive yields where Options.Yield asks
				} else if b.fpProgressLocked() {
					C.gu_context_progress(b.ctx)
				}
				b.reapLocked()
			}
			if h.IsCompleted() && h.rec == nil {
				h.mine = true // seen done under b.mu, its record recycled (Release)
			}
			resched := b.reschedDueLocked()
			b.mu.Unlock()
			if !live {
				return
			}
			if resched {
				runtime.Gosched()
			}
			if held && b.yield != 0 {
				C.gu_yield()
			}
		}
	}
	return start
}

// reschedDueLocked counts a round of a goroutine that calls into UCC
// (a gu_drive call, a submit) and reports whether it should pass through
// the Go scheduler now, after b.mu (reschedEvery says why): once every
// reschedEvery, the clock read once every 128 rounds. b.mu is held.
func (b *Backend) reschedDueLocked() bool {
	b.rounds++
	if b.rounds&127 != 0 {
		return false
	}
	now := time.Now()
	if now.Sub(b.lastResched) <= reschedEvery {
		return false
	}
	b.lastResched = now
	return true
}

// lockOut takes b.mu for a goroutine that is not a driver: a submit, the
// progress goroutine's watchdog and remote-error rounds, Abort, Close.
// Raising b.posting first ends a driver's slice in C within a round of
// progress (gu_drive reads it), where a plain Lock would wait for the
// slice's end, up to driveSlice, and keeps the drivers' TryLock off
// until it holds the lock.
func (b *Backend) lockOut() {
	b.posting.Add(1)
	b.mu.Lock()
	b.posting.Add(-1)
}
