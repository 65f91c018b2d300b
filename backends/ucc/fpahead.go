package ucc

/*
#include <stdlib.h>
#include "ucc_dl.h"
*/
import "C"

import (
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
	g.ver = append(g.ver, w)
	b.fpStartedLocked(w, C.gu_coll_start(b.team, &w.descs[0], 1, &w.reqs[0], &w.at, &w.post, pctx, &w.cerr))
	b.fpVerifyLocked()
	return true
}

// fpAheadShmLocked is fpAheadLocked on the shared-memory board: the
// publication, the start and the look at the peers' slots in one C call
// (gu_fp_ahead). When every peer's slot is in and equal, the check is done
// there (when no earlier work posted ahead waits for its own, which goes
// first); otherwise the work joins g.ver for fpVerifyLocked, as on the
// other boards. Why: at 8 B the Go around the board (the slot's stores and
// loads, judge) was ~8 % of a 2-rank op's samples, and the raw loop has
// none of it. b.mu is held.
func (b *Backend) fpAheadShmLocked(w *work, sb *shmBoard, pctx C.uintptr_t) bool {
	g, seq := b.fp, w.fpw.seq
	if !sb.hasRoom(seq) {
		return false // no room: the held path publishes it later
	}
	g.pub++
	g.nAhead++
	w.fpw.held, w.fpw.ahead = false, true
	if len(g.ver) > 0 {
		// Earlier works posted ahead still wait for their peers' slots:
		// judge them first (by now their peers have usually published),
		// so that C can look at this one's too. Why: C looks only when
		// no earlier work waits (they go first), and the judge after the
		// call then read this op's slots in Go as well, one of the steps
		// of the rank that posts first (~1.5 % of its samples).
		b.fpVerifyLocked()
	}
	var slots *C.uintptr_t
	var nslots C.int
	if len(g.ver) == 0 {
		g.watch(sb, seq)
		slots, nslots = &g.slots[0], C.int(len(g.slots))
	}
	w1, w2 := w.fpw.slot.words()
	// The verdict lives in the gate: a local whose address goes to C
	// escapes, an allocation per op.
	st := C.gu_fp_ahead(b.team, &w.descs[0], &w.reqs[0], &w.at, &w.post, pctx, &w.cerr,
		C.uintptr_t(uintptr(unsafe.Pointer(sb.r.slot(g.rank, seq)))), C.uint64_t(seq+1), C.uint64_t(w1), C.uint64_t(w2),
		slots, nslots, &g.verdict)
	verdict := g.verdict
	b.fpStartedLocked(w, st)
	if verdict == 1 {
		// Every peer's op is this one: what fpVerifyLocked does on agreement.
		g.chk = seq + 1
		g.board.checked(g.chk)
		w.fpw.ahead = false
		return true
	}
	g.ver = append(g.ver, w)
	if verdict == 2 || nslots == 0 {
		// The words differ (judge names them), or earlier works still go
		// first: their peers may have published during the call.
		b.fpVerifyLocked()
	}
	return true
}

// fpVerifyLocked checks the works posted ahead, in order, once every
// peer's slot of theirs is there: agreement lets the work complete when
// UCC is done with it; a mismatch fails it with the verdict. b.mu is held.
func (b *Backend) fpVerifyLocked() {
	g := b.fp
	n := 0
	for _, w := range g.ver {
		v, done := judge(g.board, g.rank, g.size, w.fpw.seq, w.fpw.slot)
		if !done {
			break
		}
		n++
		g.chk = w.fpw.seq + 1
		g.board.checked(g.chk)
		w.fpw.ahead = false
		if v.kind != nil {
			// UCC runs the op to its end (every peer posted L's collective in
			// its place); the work stays pending until then.
			w.fail(&backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: v.kind, Detail: v.detail, Ranks: v.ranks})
		}
	}
	if n > 0 {
		m := copy(g.ver, g.ver[n:])
		clear(g.ver[m:])
		g.ver = g.ver[:m]
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
