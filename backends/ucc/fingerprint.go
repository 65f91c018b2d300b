package ucc

/*
#include "ucc_dl.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/tensor"
)

// The fingerprint check of the ops (fpboard.go has the board): how an op
// goes from issue to UCC when it is on.
//
// At issue (submit, under b.mu) an op of the whole group gets the next
// number and publishes its fingerprint. It goes to UCC (initialised and
// posted, gu_coll_start) right there when it is at the head of the queue
// and every peer's fingerprint of its number is already there and equal:
// the last rank to issue an op starts it at once (and an in-place
// allreduce equal to the last op the group agreed on goes to UCC at
// issue, its check to follow: fpahead.go). Otherwise the work
// waits in the queue, in b.pending but unknown to UCC (held), and every
// round of the progress loop (reapLocked: the progress goroutine, or a
// caller driving its Wait) publishes what has room and starts the head
// works whose peers agree, in issue order, so that UCC sees every rank's
// ops in the same order. The caller never blocks at issue.
//
// UCC sees nothing of a held op, not even its initialisation: UCC tags a
// team's collectives as it initialises them, and ranks that initialised
// an allreduce of 1024 and one of 1000 elements and finalised both
// unposted hung in their next, matching op (seen with UCC 1.9: the sizes
// pick different algorithms, whose counters then disagree). One rank
// alone that initialises an allreduce and finalises it unposted hangs
// the group's next allreduce too (tl/ucp takes an op's tag from the
// team's counter at init: runs/2026-12-01_ucc12c-early-init/), so an
// init cannot start ahead of the look at the board either. Disagreement fails the work, on every rank, with the
// verdict's words, and the group works on. The price: UCC's refusal of an
// op (ErrUnsupported) comes back at issue only where the op starts at
// once, else from Wait. Point to point ops (two-rank active sets) carry no
// fingerprint, but queue behind a held op to keep the order.
//
// A held work is watched like a posted one: past its timeout it fails
// with ErrTimeout naming the peers whose fingerprints have not come, and
// stays queued (it goes to UCC if they come, as a posted op stays posted,
// so the late peers' op completes); a peer whose process has exited (shm)
// or whose side channel broke (tcp) fails it at the next watchdog tick
// with ErrRemote naming that peer.
type fpGate struct {
	board      fpBoard
	rank, size int
	next       uint64        // numbers given out
	pub        uint64        // numbers published (in order)
	chk        uint64        // numbers checked: their works left the queue
	q          []*work       // the works not yet through, in issue order
	issuing    *work         // the work submit is issuing, during its step
	slots      []C.uintptr_t // fpDriveLocked's peer slot addresses (fpfast.go)

	// Posting ahead (fpahead.go).
	ahead  bool   // Options.FingerprintsAhead
	last   fpSlot // L: the last op the group agreed on and put into UCC
	lastOK bool   // last is set
	// lastDesc is fpDesc(last), worked out once per change of L rather
	// than once per op posted ahead (fpAheadOK): it was ~4 % of a 2-rank
	// 8 B op's samples (uccReduction's switches, twice per op).
	lastDesc   C.gu_desc
	lastDescOK bool
	ver        []fpVer // the ops posted ahead, not yet checked, in order
	// lazy: an op posted ahead may complete before its check once UCC is
	// done with it (the shared-memory board; fpahead.go says why that is
	// safe), and the check follows in batches.
	lazy       bool
	scratch    unsafe.Pointer // C memory the stand-ins point UCC at; nil: none yet
	scratchLen int
	// outgrown holds scratch that a larger stand-in replaced: an earlier
	// stand-in may still be in UCC over it, so it is freed only at Close.
	outgrown []unsafe.Pointer
	verdict  C.int         // gu_drive's verdict (fpVerifyWatchLocked)
	vslots   []C.uintptr_t // gu_drive's peer slots of g.ver[0].seq (fpVerifyWatchLocked)
	rings    []C.uintptr_t // gu_fp_agree's peer rings (fpAgreeLocked)
	nAhead   uint64        // works posted ahead (for the tests)
	nStandIn uint64        // stand-ins posted
}

// fpVer is an op posted ahead of its check, not yet checked: its number,
// this rank's slot, and its work until that completes (w is nil after:
// the record goes back to the pool, and may be planning another op
// outside b.mu).
type fpVer struct {
	w    *work
	seq  uint64
	slot fpSlot
}

// fpWork is a work's part in the check.
type fpWork struct {
	on       bool // the op has a fingerprint (slot); false: point to point
	held     bool // queued: UCC has not seen it
	startErr bool // it failed in gu_coll_start (UCC refused it)
	ahead    bool // posted ahead of its check, which is still to come (fpahead.go)
	seq      uint64
	slot     fpSlot
}

// print gives the plan's op its fingerprint: op, dtype, reduce op (nil:
// none), element count (negative: not compared) and root (-1: none).
func (p *plan) print(dt tensor.DType, r *backend.ReduceOp, count, root int) {
	p.w.fpw = fpWork{on: true, slot: fpSlot{fp: opcheck.Of(p.op, dt, r, count), root: int32(root)}}
}

// fpSubmitLocked is submit's tail while the check is on, for an op with a
// fingerprint or one that queues behind one. b.mu is held; the work's
// buffers are pinned and its deps and enq set. The work joins b.pending
// only if it has to wait (held, or in UCC after an inline start), so that
// an op the last rank starts and UCC finishes at once costs no more than
// without the check (submit's inline path).
func (b *Backend) fpSubmitLocked(p *plan) (backend.Work, error) {
	g, w := b.fp, p.w
	if w.fpw.on {
		w.fpw.seq = g.next
		g.next++
	}
	if !w.fpw.on || !b.fpAheadLocked(w) {
		w.fpw.held = true
		g.q = append(g.q, w)
		g.issuing = w
		b.fpStepLocked()
		g.issuing = nil
	}
	h, startErr := w.h, w.fpw.startErr // before testLocked, which may recycle w
	if !w.fpw.held && (!w.fpw.ahead || g.lazy) && w.live == 0 && len(w.deps) == 0 {
		// Done in its start (its check to follow, when lazy), or nothing
		// for UCC to do: complete now, as submit does.
		w.testLocked(true)
	} else {
		b.pending = append(b.pending, w)
		b.npending.Store(int32(len(b.pending)))
		b.wake()
	}
	if startErr {
		// Started at once and refused by UCC: the error comes back now,
		// as without the check.
		return nil, h.err()
	}
	return h, nil
}

// fpStepLocked publishes the queue's fingerprints that have room, then
// lets the head works through while their checks are done. b.mu is held.
func (b *Backend) fpStepLocked() {
	g := b.fp
	if g == nil {
		return
	}
	if len(g.ver) > 0 && (len(g.q) > 0 || !g.lazy) {
		b.fpVerifyLocked()
	}
	if len(g.q) == 0 {
		return
	}
	for _, w := range g.q {
		if !w.fpw.on || w.fpw.seq < g.pub {
			continue
		}
		if !g.board.post(w.fpw.seq, w.fpw.slot) {
			break
		}
		g.pub++
	}
	if len(g.ver) > 0 {
		return // the works posted ahead are checked first, in order
	}
	n := 0
	for _, w := range g.q {
		if !b.fpReleaseLocked(w) {
			break
		}
		n++
	}
	if n > 0 {
		// Shift down, so that the queue's array is reused: a queue of one
		// op at a time allocates nothing.
		m := copy(g.q, g.q[n:])
		clear(g.q[m:])
		g.q = g.q[:m]
	}
}

// fpReleaseLocked lets w, the head of the queue, through once every
// peer's fingerprint is there: it starts it in UCC, or fails it unstarted
// on a mismatch. It reports whether w left the queue.
func (b *Backend) fpReleaseLocked(w *work) bool {
	g := b.fp
	if !w.fpw.on {
		b.fpStartLocked(w)
		return true
	}
	if w.fpw.seq >= g.pub {
		return false // not yet published: the peers wait for it
	}
	// A work that failed meanwhile (its timeout) still goes to UCC once
	// its peers agree, as a posted one stays posted: the late peers' op
	// completes, and the ops after it stay in step.
	v, done := judge(g.board, g.rank, g.size, w.fpw.seq, w.fpw.slot)
	if !done {
		return false
	}
	g.chk = w.fpw.seq + 1
	g.board.checked(g.chk)
	if v.kind != nil {
		s, ahead := fpAheadPeer(g, w.fpw.seq)
		if ahead && len(b.fpUnackedLocked(w.fpw.seq)) > 0 {
			// A peer that posted its op ahead may complete it unchecked
			// (lazy): the stand-in waits until every such peer has read
			// this slot, and with it the mismatch (fpahead.go).
			return false
		}
		w.fail(&backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: v.kind, Detail: v.detail, Ranks: v.ranks})
		if ahead {
			b.fpStandInLocked(w, s) // a peer posted its op ahead: UCC runs that one here too
			return true
		}
		w.fpw.held, w.live = false, 0 // reapLocked unpins it and takes it out of b.pending
		return true
	}
	b.fpAheadDoneLocked(w.fpw.seq, w.fpw.slot)
	b.fpStartLocked(w)
	return true
}

// fpStartLocked initialises and posts w's collectives (gu_coll_start), as
// submit does without the check (at one rank progressing a small op once
// inline when w is being issued, fpGate.issuing); a failure fails the work.
func (b *Backend) fpStartLocked(w *work) {
	w.fpw.held = false
	w.live = 0
	if len(w.descs) == 0 {
		return
	}
	var pctx C.uintptr_t
	// Only at one rank: with peers, an op that starts at its issue is the
	// last rank's, whose fingerprint they see only now, so none of them
	// can have posted it, and the inline progress round and test (a few
	// hundred ns of the pacing rank's issue at 8 B) never found it done;
	// its Wait progresses it. Alone, UCC finishes it in its post.
	if w == b.fp.issuing && len(w.deps) == 0 && w.plan.inline() && b.fp.size == 1 {
		pctx = b.ctx
	}
	b.fpStartedLocked(w, C.gu_coll_start(b.team, &w.descs[0], C.int(len(w.descs)), &w.reqs[0], &w.at, &w.post, pctx, &w.cerr))
}

// fpStartedLocked takes in gu_coll_start's (or gu_fp_drive's) result st
// for w: the requests left in progress, or the failure, which fails the
// work.
func (b *Backend) fpStartedLocked(w *work, st C.int) {
	if st >= 0 {
		w.live = min(int(st), len(w.reqs))
		w.noteErr()
		return
	}
	var oe *backend.OpError
	if w.post == 0 {
		err := &Error{Call: "ucc_collective_init", Status: int(st)}
		oe = &backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: errKind(err), Err: err,
			Detail: fmt.Sprintf("collective %d of %d of the op", int(w.at)+1, len(w.descs))}
	} else {
		// The ones before are posted and stay, as after a timeout.
		err := &Error{Call: "ucc_collective_post", Status: int(st)}
		oe = &backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: errKind(err), Err: err}
		w.reqs = w.reqs[:w.at]
		w.live = len(w.reqs)
	}
	w.fpw.startErr = true
	w.fail(oe)
}

// fpProgressLocked reports whether a driver whose work has not started
// needs to progress UCC: not while every pending work is held (UCC has
// nothing of this group's), so that the driver of a held work sees its
// peers' fingerprints a progress call sooner.
func (b *Backend) fpProgressLocked() bool {
	return b.fp == nil || len(b.pending) != len(b.fp.q)
}

// fpTickLocked runs at the watchdog's tick: a held head work whose
// missing peer is gone fails now, naming it, rather than at its timeout.
func (b *Backend) fpTickLocked() {
	g := b.fp
	if g == nil || len(g.q)+len(g.ver) == 0 {
		return
	}
	var w *work
	if len(g.q) > 0 {
		w = g.q[0]
	}
	for _, v := range g.ver {
		if v.w != nil {
			w = v.w // posted ahead, waiting for its peers' slots as a held one does
			break
		}
	}
	if w == nil || !w.fpw.on || (!w.fpw.held && !w.fpw.ahead) || w.IsCompleted() {
		return
	}
	ranks, _ := missing(g.board, g.rank, g.size, w.fpw.seq)
	for _, p := range ranks {
		if culprit, err := g.board.gone(p); err != nil {
			seen := "UCC never saw the op"
			if w.fpw.ahead {
				seen = "this rank had posted it to UCC ahead of the check"
			}
			w.fail(&backend.OpError{Op: w.op.String(), Seq: w.m.Seq, Rank: b.cfg.Rank, Backend: Name, Kind: backend.ErrRemote, Ranks: []int{culprit},
				Detail: fmt.Sprintf("%v, before rank %d published this op's fingerprint; %s", err, p, seen)})
			return
		}
	}
}

// fpTimeout is what the timeout of a held work says: the peers whose
// fingerprints have not come. held is false for a work UCC has.
func (b *Backend) fpTimeout(w *work, elapsed time.Duration) (ranks []int, sentence string, held bool) {
	b.lockOut()
	defer b.mu.Unlock()
	g := b.fp
	if g == nil || !w.fpw.held || !w.fpw.on {
		return nil, "", false
	}
	ranks, why := missing(g.board, g.rank, g.size, w.fpw.seq)
	sentence = fmt.Sprintf("the backend's watchdog saw it %v after issue (group %s) still waiting for the fingerprints of ranks %v, so UCC has not seen it; it goes to UCC if they come",
		elapsed.Round(time.Millisecond), b.cfg.GroupDesc, ranks)
	if len(ranks) == 0 {
		if ranks = b.fpUnackedLocked(w.fpw.seq); len(ranks) > 0 {
			// Every fingerprint is in and they differ: the stand-in waits for
			// the ranks that posted the op ahead to read the mismatch.
			sentence = fmt.Sprintf("the backend's watchdog saw it %v after issue (group %s) still waiting for ranks %v, which posted it to UCC ahead of the check, to read this rank's mismatching fingerprint, so UCC has not seen this rank's part",
				elapsed.Round(time.Millisecond), b.cfg.GroupDesc, ranks)
		}
	}
	if len(why) > 0 {
		sentence += " (" + strings.Join(why, "; ") + ")"
	}
	return ranks, sentence, true
}

// fpDType is the dtype of a list's first tensor (0 for an empty list).
func fpDType(ts []*tensor.Tensor) tensor.DType {
	if len(ts) == 0 || ts[0] == nil {
		return 0
	}
	return ts[0].DType()
}

// fpCount is the element count of a list of tensors.
func fpCount(ts []*tensor.Tensor) int {
	n := 0
	for _, t := range ts {
		if t != nil {
			n += t.Numel()
		}
	}
	return n
}

// fpCloseLocked releases the board at Close, with the team.
func (b *Backend) fpCloseLocked() {
	if b.fp == nil {
		return
	}
	b.fp.fpFreeScratchLocked()
	if err := b.fp.board.close(); err != nil {
		slog.Warn("gocoll ucc: close: the fingerprint board", "rank", b.cfg.Rank, "err", err)
	}
	b.fp = nil
}
