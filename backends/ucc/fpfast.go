package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import "unsafe"

// The fast path of a held op's Wait (shared-memory board only): the
// driver's loop, waiting for the peers' fingerprints and then starting and
// driving the op, runs in C (gu_fp_drive), one crossing where the Go loop
// took a round of TryLock, reap, publish and judge per look at the board
// and a second crossing to start the op. At 8 B the time from the last
// peer's publication to this rank's post is on the critical path of
// every op (the price of the check, fingerprint.go), so the shorter the
// look, the smaller the price. C only compares: when every peer's words
// equal this rank's, the op starts there; any difference (a count that
// agrees with any count, or a mismatch) comes back to Go's judge, which
// has the words for the error. UCC sees nothing of the op before that.

// watch fills g.slots with the addresses of the peers' slots of seq on
// the shared-memory board sb.
func (g *fpGate) watch(sb *shmBoard, seq uint64) {
	if cap(g.slots) < g.size-1 {
		g.slots = make([]C.uintptr_t, 0, g.size-1)
	}
	g.slots = g.slots[:0]
	for p := range g.size {
		if p != g.rank {
			g.slots = append(g.slots, C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slotWord(p, seq, 0)))))
		}
	}
}

// fpWatchLocked is what a driver of an op in UCC watches besides it
// (gu_drive): the peers' slots of the first op held for their
// fingerprints, published and at the head of the queue, so that the loop
// ends as soon as they are all in and Go starts that op (in a window of
// several ops, the Wait of the oldest is what starts the newer ones; a
// slice of driveSpin between two looks delayed each start by up to 20
// µs, a tenth of a 1 MiB allreduce). nslots is 0 when there is nothing
// to watch (check off, another transport, nothing held). b.mu is held.
func (b *Backend) fpWatchLocked() (slots *C.uintptr_t, nslots C.int, tag C.uint64_t) {
	g := b.fp
	if g == nil || len(g.q) == 0 || g.size < 2 {
		return nil, 0, 0
	}
	w := g.q[0]
	sb, ok := g.board.(*shmBoard)
	if !ok || sb.r == nil || !w.fpw.held || !w.fpw.on || w.fpw.seq >= g.pub {
		return nil, 0, 0
	}
	g.watch(sb, w.fpw.seq)
	return &g.slots[0], C.int(len(g.slots)), C.uint64_t(w.fpw.seq + 1)
}

// fpDriveLocked drives w, held for its peers' fingerprints at the head
// of the queue, through gu_fp_drive. It reports false where the fast path
// does not apply (another transport, not the head, nothing for UCC) or C
// found words to judge: the caller then runs the Go loop's round. b.mu is
// held.
func (b *Backend) fpDriveLocked(w *work, stop *C.int32_t) bool {
	g := b.fp
	sb, ok := g.board.(*shmBoard)
	if !ok || sb.r == nil || !w.fpw.held || !w.fpw.on || len(w.descs) == 0 || len(g.q) == 0 || g.q[0] != w || w.fpw.seq >= g.pub {
		return false
	}
	if len(g.ver) > 0 {
		// The ops posted ahead are checked first (a lazy batch's slots are
		// usually all in by now).
		if b.fpVerifyLocked(); len(g.ver) > 0 {
			return false
		}
	}
	g.watch(sb, w.fpw.seq)
	w1, w2 := w.fpw.slot.words()
	// Progress while waiting only when UCC has ops of this group
	// (fpProgressLocked): otherwise the look at the board comes sooner.
	progress := C.int(0)
	if b.fpProgressLocked() {
		progress = 1
	}
	var started C.int
	st := C.gu_fp_drive(b.team, &w.descs[0], C.int(len(w.descs)), &w.reqs[0], &w.at, &w.post, b.ctx, &w.cerr,
		stop, C.int64_t(driveSpin), b.yield, &g.slots[0], C.int(len(g.slots)), C.uint64_t(w.fpw.seq+1), C.uint64_t(w1), C.uint64_t(w2),
		progress, &started)
	if started == 0 {
		return st == C.GU_FP_WAITING
	}
	// Checked and started: what fpReleaseLocked and fpStartLocked do
	// after a Go judge's agreement.
	g.chk = w.fpw.seq + 1
	g.board.checked(g.chk)
	b.fpAheadDoneLocked(w.fpw.seq, w.fpw.slot) // C starts it only when every peer's words equal this rank's
	m := copy(g.q, g.q[1:])
	g.q[m] = nil
	g.q = g.q[:m]
	w.fpw.held = false
	b.fpStartedLocked(w, st)
	return true
}

// fpVerifyArgs are gu_drive's arguments for the look at the peers' slots
// of the next op posted ahead of its check (g.ver[0]).
type fpVerifyArgs struct {
	slots       *C.uintptr_t
	tag, w1, w2 C.uint64_t
	verdict     *C.int
}

// fpVerifyWatchLocked returns gu_drive's arguments for g.ver[0] on the
// shared-memory board, with nv the number of peer slots (0: nothing to
// look at: no op posted ahead waits for its check, or another board).
// The verdict starts at 0 (not yet). b.mu is held.
func (b *Backend) fpVerifyWatchLocked() (v fpVerifyArgs, nv C.int) {
	g := b.fp
	if g == nil || len(g.ver) == 0 {
		return v, 0
	}
	sb, ok := g.board.(*shmBoard)
	if !ok || sb.r == nil {
		return v, 0
	}
	e := g.ver[0]
	if cap(g.vslots) < g.size-1 {
		g.vslots = make([]C.uintptr_t, 0, g.size-1)
	}
	g.vslots = g.vslots[:0]
	for p := range g.size {
		if p != g.rank {
			g.vslots = append(g.vslots, C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slotWord(p, e.seq, 0)))))
		}
	}
	w1, w2 := e.slot.words()
	g.verdict = 0
	return fpVerifyArgs{slots: &g.vslots[0], tag: C.uint64_t(e.seq + 1), w1: C.uint64_t(w1), w2: C.uint64_t(w2), verdict: &g.verdict},
		C.int(len(g.vslots))
}

// fpVerifiedLocked takes in gu_drive's verdict on g.ver[0]: on agreement
// (every peer's words equal this rank's) the op's check is done, as
// fpVerifyLocked does it; a difference, or a slot not yet in, is left to
// fpVerifyLocked, whose judge has the words for the error. b.mu is held.
func (b *Backend) fpVerifiedLocked() {
	g := b.fp
	if g.verdict != 1 || len(g.ver) == 0 {
		return
	}
	if w := g.ver[0].w; w != nil {
		w.fpw.ahead = false
	}
	g.pass(1)
}
