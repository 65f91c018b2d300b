package ucc

/*
#include <stdlib.h>
#include "ucc_dl.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// Posting ahead of the check (Options.FingerprintsAhead, on by default).
//
// The check's price is its hold: a rank posts op k only once the last
// rank has published k's fingerprint, so every rank but the last does its
// init and post after that publication, on the critical path (one hop and
// an init+post at 8 B; at 4 ranks and 1 MiB the posts that the raw loop
// does in the slack before the last rank comes). A loop of one op over and
// over needs no hold to stay safe, only a rule every rank can check:
//
//   - L is the fingerprint of the last op the group agreed on and put into
//     UCC (fpGate.last). Every rank has the same L, since every rank judges
//     the same slots by the same rule, in order.
//   - A rank may post op k at issue, before looking at its peers' slots,
//     when nothing of its own is held before it (fpGate.q is empty), k's
//     fingerprint equals L and the op is a plain in-place allreduce whose
//     UCC collective fpDesc rebuilds from the fingerprint alone. It says
//     so in its slot (fpSlot.ahead), and checks the peers' slots later,
//     while UCC runs the op (fpVerifyLocked); the work does not complete
//     before that check.
//   - A rank whose op k is held and whose judge finds a slot of k posted
//     ahead goes on as before when every fingerprint agrees (it posts its
//     own op, the same collective). On a mismatch it fails its work with
//     the verdict, as before, but posts in its place the collective that
//     the ahead rank posted (fpDesc of that slot) over scratch memory of
//     its own (fpGate.scratch). So UCC sees, on every rank and for every
//     number, the same collective: nothing but the ahead rank's result (and
//     the scratch) holds the mismatched sum, tl/ucp's tags stay in step,
//     and the group works on, as the mismatch specs require.
//   - The ahead rank fails its work with the same verdict (the same words,
//     judge's) once it has read every slot; its tensor then holds a sum
//     with another rank's scratch, as an op that failed may leave it.
//   - On the shared-memory board the check of an op posted ahead is lazy:
//     its work completes as soon as UCC is done with it, and the rank
//     reads the peers' slots later: a batch at a time (fpVerBatch), before
//     a held op, or while one of its ops posted ahead waits in UCC (it has
//     the time then: fpStuckLocked). This is safe because such an op
//     completes in UCC only once every peer has put something of that
//     number into UCC: its own op, which is L as this one is (it went
//     ahead too, or its judge found every slot equal), or a stand-in after
//     a mismatch; and a peer posts a stand-in only once every rank whose
//     slot says it went ahead has checked that number (fpUnackedLocked
//     reads their counts on the board). So an ahead rank has read the
//     mismatch, and failed its work, before its op can complete. A check
//     that finds a mismatch in an op that completed unchecked would mean
//     the rule broke: the backend then stops (fpBrokenLocked).
//
// Why not post every op ahead and only check afterwards: ops that differ
// in UCC do not fail cleanly. Two ranks that each posted their own
// allreduce of 1024 and 1000 float32 elements run different algorithms
// (tl/ucp's allreduce switches at 4 KiB, and its schedules take one tag
// per task), so their tag counters part and the group hangs from then on
// (fingerprint.go). The rule above never lets two different collectives
// reach UCC under one number: only ops equal to L go ahead, and whoever
// differs posts L's collective instead.

// fpAheadBit is fpSlot.ahead in a slot's first data word (bits 24-31 of
// it are free: op, dtype and reduce op take the three bytes below, the
// root the upper half). It is ucc_dl.h's GU_FP_AHEAD, which gu_fp_drive
// masks out, so the two sides cannot disagree.
const fpAheadBit = C.GU_FP_AHEAD

// fpDesc is the UCC collective of an op posted ahead with fingerprint s,
// without its buffers, and its size in bytes; false where s is not an
// in-place allreduce UCC reduces whole (no AVG or PREMUL_SUM, no widened
// dtype) over at least one element.
func fpDesc(s fpSlot) (C.gu_desc, int, bool) {
	fp := s.fp
	if fp.Op != uint8(backend.OpAllreduce)+1 || fp.ReduceOp == 0 || s.root != -1 || fp.Count == 0 || fp.Count > 1<<40 {
		return C.gu_desc{}, 0, false
	}
	op := backend.ReduceOp{Type: reduceop.Type(fp.ReduceOp - 1)}
	if op.Type == backend.Avg || op.Type == backend.PreMulSum {
		return C.gu_desc{}, 0, false
	}
	dt := tensor.DType(fp.DType)
	if op.ValidFor(dt) != nil {
		return C.gu_desc{}, 0, false
	}
	r, err := uccReduction(dt, op)
	if err != nil || r.ratio != 1 {
		return C.gu_desc{}, 0, false
	}
	n := C.uint64_t(fp.Count)
	return C.gu_desc{coll_type: collAllreduce, op: C.int(r.op), dt: C.uint64_t(r.dt), flags: flagInPlace, src_count: n, dst_count: n},
		int(fp.Count) * r.elemLen, true
}

// fpAheadOK reports whether w may be posted ahead of its check (the rule
// above): the gate's queue is empty, its fingerprint is L, and its one
// collective is fpDesc's. b.mu is held.
func (b *Backend) fpAheadOK(w *work) bool {
	g := b.fp
	if !g.ahead || !g.lastOK || !g.lastDescOK || len(g.q) != 0 || g.size < 2 || !w.fpw.on || w.fpw.slot != g.last ||
		w.fpw.seq != g.pub || len(w.descs) != 1 || len(w.deps) != 0 {
		return false
	}
	d, o := &g.lastDesc, &w.descs[0] // fpDesc(g.last), which w's slot equals
	return o.coll_type == d.coll_type && o.op == d.op && o.dt == d.dt && o.flags == d.flags &&
		o.src_count == d.src_count && o.dst_count == d.dst_count && o.v_src == 0 && o.v_dst == 0 && o.as_size == 0
}

// fpAheadLocked posts w ahead of its check when the rule allows and its
// slot has room: it publishes the slot marked ahead, starts the op (a
// small one progressed once inline, as without the check) and queues it
// for fpVerifyLocked. It reports whether it did. b.mu is held.
func (b *Backend) fpAheadLocked(w *work) bool {
	g := b.fp
	if !b.fpAheadOK(w) {
		return false
	}
	seq, s := w.fpw.seq, w.fpw.slot
	s.ahead = true
	var pctx C.uintptr_t
	if w.plan.inline() {
		pctx = b.ctx
	}
	if sb, ok := g.board.(*shmBoard); ok && sb.r != nil {
		return b.fpAheadShmLocked(w, sb, pctx)
	}
	if !g.board.post(seq, s) {
		return false // no room: the held path publishes it later
	}
	g.pub++
	g.nAhead++
	w.fpw.held, w.fpw.ahead = false, true
	g.ver = append(g.ver, fpVer{w: w, seq: seq, slot: w.fpw.slot})
	b.fpStartedLocked(w, C.gu_coll_start(b.team, &w.descs[0], 1, &w.reqs[0], &w.at, &w.post, pctx, &w.cerr))
	b.fpVerifyLocked()
	return true
}

// fpAheadShmLocked is fpAheadLocked on the shared-memory board: the
// publication and the start in one C call (gu_fp_ahead). The check follows
// later and in batches (lazy, above): the work joins g.ver, and it may
// complete as soon as UCC is done with it. Why: reading a peer's slot
// right after the start, as this did, moved two cache lines between the
// ranks' cores per op (the peer's slot to this rank, and this rank's slot
// back to it for the next write), ~0.25 µs of a 2-rank 8 B op of ~1 µs on
// the dev machine, as much as all of the backend's Go (docs/perf.md, ucc
// "Sixteenth round"). b.mu is held.
func (b *Backend) fpAheadShmLocked(w *work, sb *shmBoard, pctx C.uintptr_t) bool {
	g, seq := b.fp, w.fpw.seq
	if !sb.hasRoom(seq) {
		return false // no room: the held path publishes it later
	}
	if len(g.ver) >= fpVerBatch {
		// Check a batch, so that the peers' rings have room: their slots
		// of these numbers have been there since they posted them.
		b.fpVerifyLocked()
	}
	g.pub++
	g.nAhead++
	w.fpw.held, w.fpw.ahead = false, true
	w1, w2 := w.fpw.slot.words()
	st := C.gu_fp_ahead(b.team, &w.descs[0], &w.reqs[0], &w.at, &w.post, pctx, &w.cerr,
		C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slot(g.rank, seq)))), C.uint64_t(seq+1), C.uint64_t(w1), C.uint64_t(w2),
		C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slot(g.rank, seq+1)))))
	g.ver = append(g.ver, fpVer{w: w, seq: seq, slot: w.fpw.slot})
	b.fpStartedLocked(w, st)
	return true
}

// fpVerBatch is how many ops posted ahead wait for their check, at most,
// before an issue checks them: a fraction of the ring (fpSlots), so that
// a peer never waits for room.
const fpVerBatch = 64

// fpStuckLocked is the lazy check's turn while an op posted ahead waits in
// UCC (a driver's slice ended with it in progress, or the progress
// goroutine runs the ops nobody waits for): this rank has the time, and a
// peer held on a mismatch may be waiting for this rank's check of it
// before it posts (fpUnackedLocked). b.mu is held.
func (b *Backend) fpStuckLocked() {
	if g := b.fp; g != nil && len(g.ver) > 0 {
		b.fpVerifyLocked()
	}
}

// fpUnackedLocked returns the peers that posted op seq ahead and have not
// checked it yet (read every slot of it, this rank's with its mismatch
// included): a stand-in for it waits for them, since until it is posted
// their op cannot complete, so they learn of the mismatch before it does
// (lazy, above). Any peer that posted ahead on this board is lazy,
// whatever this rank's own Options say. On the other boards a peer checks
// before its op completes, and the list is empty. b.mu is held.
func (b *Backend) fpUnackedLocked(seq uint64) []int {
	g := b.fp
	sb, ok := g.board.(*shmBoard)
	if !ok || sb.r == nil {
		return nil
	}
	var ranks []int
	for p := range g.size {
		if p == g.rank {
			continue
		}
		if s, ok := g.board.peek(p, seq); ok && s.ahead && sb.r.checked(p).Load() <= seq {
			ranks = append(ranks, p)
		}
	}
	return ranks
}

// fpVerifyLocked checks the ops posted ahead, in order, once every peer's
// slot of theirs is there: agreement lets a waiting work complete when UCC
// is done with it; a mismatch fails it with the verdict. b.mu is held.
func (b *Backend) fpVerifyLocked() {
	g := b.fp
	n := b.fpAgreeLocked()
	for _, e := range g.ver[:n] {
		if w := e.w; w != nil {
			w.fpw.ahead = false
		}
	}
	for _, e := range g.ver[n:] {
		v, done := judge(g.board, g.rank, g.size, e.seq, e.slot)
		if !done {
			break
		}
		n++
		w := e.w
		if w == nil {
			if v.kind != nil {
				// Completed unchecked, and the peers disagree: the stand-in
				// rule (fpUnackedLocked) was broken, and the op's result may
				// be wrong. Nothing of the group can be trusted now.
				b.fpBrokenLocked(e.seq, v)
			}
			continue
		}
		w.fpw.ahead = false
		if v.kind != nil {
			// UCC runs the op to its end (every peer posted L's collective in
			// its place); the work stays pending until then.
			w.fail(&backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: v.kind, Detail: v.detail, Ranks: v.ranks})
		}
	}
	if n > 0 {
		g.pass(n)
	}
}

// pass drops the first n ops of g.ver, checked: the board's count of this
// rank's checked ops moves past them, which the peers' stand-ins wait for
// (fpUnackedLocked). b.mu is held.
func (g *fpGate) pass(n int) {
	g.chk = g.ver[n-1].seq + 1
	g.board.checked(g.chk)
	m := copy(g.ver, g.ver[n:])
	clear(g.ver[m:])
	g.ver = g.ver[:m]
}

// fpUncheckedLocked notes that w, posted ahead, completes before its
// check (lazy): its entry in g.ver keeps the number and the slot, not the
// record. b.mu is held.
func (b *Backend) fpUncheckedLocked(w *work) {
	g := b.fp
	// From the end: the ops in flight are the last few entries.
	for i := len(g.ver) - 1; i >= 0; i-- {
		if g.ver[i].w == w {
			g.ver[i].w = nil
			break
		}
	}
	w.fpw.ahead = false
}

// fpAgreeLocked returns how many of the leading ops of g.ver every peer's
// slot agrees with, by one look at the shared-memory board's rings in C
// (gu_fp_agree); 0 on another board, where the judge looks. It covers the
// ops with this rank's first slot, which a lazy batch's ops all have (the
// queue waits for g.ver to empty before the group can agree on another
// L). b.mu is held.
func (b *Backend) fpAgreeLocked() int {
	g := b.fp
	sb, ok := g.board.(*shmBoard)
	if !g.lazy || !ok || sb.r == nil || len(g.ver) < 2 {
		return 0
	}
	first := g.ver[0]
	n := 1
	for n < len(g.ver) && g.ver[n].slot == first.slot && g.ver[n].seq == first.seq+uint64(n) {
		n++
	}
	if g.rings == nil {
		// The peers' rings stay where they are for the board's life.
		g.rings = make([]C.uintptr_t, 0, g.size-1)
		for p := range g.size {
			if p != g.rank {
				g.rings = append(g.rings, C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slot(p, 0)))))
			}
		}
	}
	w1, w2 := first.slot.words()
	return int(C.gu_fp_agree(&g.rings[0], C.int(len(g.rings)), C.uint64_t(sb.r.k), C.uint64_t(first.seq), C.int(n), C.uint64_t(w1), C.uint64_t(w2)))
}

// The C side reads slots at GU_FP_SLOT strides (gu_fp_agree): the two
// sizes must be equal.
var _ [fpSlotSize - C.GU_FP_SLOT]struct{}
var _ [C.GU_FP_SLOT - fpSlotSize]struct{}

// fpBrokenLocked stops the backend after a check found a mismatch in an
// op that had already completed (a broken invariant, not a user's
// mismatch): every later op fails with ErrAborted saying so. b.mu is held.
func (b *Backend) fpBrokenLocked(seq uint64, v fpVerdict) {
	err := fmt.Errorf("ucc: op number %d completed before its fingerprint check, which found %s; its result may be wrong (a bug in gocoll)", seq, v.detail)
	slog.Error("gocoll ucc: fingerprint check", "rank", b.cfg.Rank, "group", b.cfg.GroupDesc, "err", err)
	if b.stopped == nil {
		b.stopped = &backend.OpError{Op: "fingerprint check", Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrAborted, Err: err}
	}
}

// fpAheadPeer returns a peer's slot of seq that was posted ahead, if any.
func fpAheadPeer(g *fpGate, seq uint64) (fpSlot, bool) {
	for p := range g.size {
		if p == g.rank {
			continue
		}
		if s, ok := g.board.peek(p, seq); ok && s.ahead {
			return s, true
		}
	}
	return fpSlot{}, false
}

// fpStandInLocked puts into UCC, for w (held, failed by a mismatch with a
// peer that posted its op ahead as s), the collective that peer posted,
// over the gate's scratch memory in place of w's buffers, so that UCC
// runs the same collective on every rank. w stays pending until UCC is
// done with it. b.mu is held.
func (b *Backend) fpStandInLocked(w *work, s fpSlot) {
	g := b.fp
	d, n, ok := fpDesc(s)
	if !ok {
		// Not a collective a rank may post ahead: a peer's slot can hold one
		// only if its gocoll differs from this one.
		w.fpw.held, w.live = false, 0
		return
	}
	if g.scratchLen < n {
		m := C.malloc(C.size_t(n))
		if m == nil {
			// No memory for the stand-in: the work fails with its verdict
			// unposted, as when the peer's op cannot be rebuilt.
			w.fpw.held, w.live = false, 0
			return
		}
		if g.scratch != nil {
			g.outgrown = append(g.outgrown, g.scratch)
		}
		g.scratch, g.scratchLen = m, n
	}
	g.nStandIn++
	d.src = C.uintptr_t(uintptr(g.scratch))
	d.dst = d.src
	w.descs = append(w.descv[:0], d)
	w.reqs = w.reqv[:1]
	b.fpStartLocked(w)
}

// fpAheadDoneLocked records that the group agreed on op seq and UCC has
// it: its fingerprint (rank 0's slot, the same words on every rank) is L
// from now on. mine is this rank's slot of seq. b.mu is held.
func (b *Backend) fpAheadDoneLocked(seq uint64, mine fpSlot) {
	g := b.fp
	s := mine
	if g.rank != 0 {
		var ok bool
		if s, ok = g.board.peek(0, seq); !ok {
			g.lastOK = false
			return
		}
	}
	s.ahead = false
	if !g.lastOK || s != g.last {
		g.lastDesc, _, g.lastDescOK = fpDesc(s)
	}
	g.last, g.lastOK = s, true
}

// fpFreeScratchLocked releases the stand-ins' scratch memory, once UCC
// holds no request (Close).
func (g *fpGate) fpFreeScratchLocked() {
	if g.scratch != nil {
		C.free(g.scratch)
		g.scratch, g.scratchLen = nil, 0
	}
	for _, p := range g.outgrown {
		C.free(p)
	}
	g.outgrown = nil
}
