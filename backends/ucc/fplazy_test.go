package ucc

import (
	"errors"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// lazyRank is one rank of a 2-rank group's lazy check (fpahead.go) on a
// board in this process's memory, with works made by hand: no UCC, so
// that each step of the rule can be set up exactly, which the two-process
// TestFingerprintsAhead leaves to timing.
type lazyRank struct{ b *Backend }

func newLazyRank(bs []*shmBoard, rank int) *lazyRank {
	b := &Backend{cfg: backend.Config{Rank: rank, WorldSize: len(bs)}}
	b.fp = &fpGate{board: bs[rank], rank: rank, size: len(bs), ahead: true, lazy: true}
	return &lazyRank{b: b}
}

// postAhead publishes seq as posted ahead with slot s and enters it in
// g.ver, as fpAheadShmLocked does; done completes it unchecked at once
// (UCC finished it in its start), else its work stays waiting.
func (r *lazyRank) postAhead(seq uint64, s fpSlot, done bool) *handle {
	b, g := r.b, r.b.fp
	w := b.newWork(backend.OpAllreduce, backend.Meta{Op: backend.OpAllreduce, Seq: seq + 1}, nil)
	w.fpw = fpWork{on: true, ahead: true, seq: seq, slot: s}
	a := s
	a.ahead = true
	g.board.(*shmBoard).r.put(g.rank, seq, a)
	g.ver = append(g.ver, fpVer{w: w, seq: seq, slot: s})
	h := w.h
	if done {
		b.fpUncheckedLocked(w)
		h.complete(nil, nil)
	}
	return h
}

// TestLazyCheck steps rank 0 of two through the lazy check of its ops
// posted ahead, rank 1 publishing what each step needs:
//   - a batch whose peer slots all agree is checked at once (gu_fp_agree),
//     done and waiting works alike, across the end of the ring too, and
//     the checked count that rank 1's stand-ins wait for moves past it;
//   - a peer slot not yet there stops the check at that op;
//   - a peer's mismatch fails a work that still waits, with judge's words;
//   - a mismatch in an op that completed unchecked (a broken rule) stops
//     the backend: later ops fail with ErrAborted saying why;
//   - rank 1, held on a mismatch with rank 0's op posted ahead, posts its
//     stand-in only once rank 0 has checked that op (fpUnackedLocked).
func TestLazyCheck(t *testing.T) {
	bs := heapGroup(2)
	r0, r1 := newLazyRank(bs, 0), newLazyRank(bs, 1)
	g := r0.b.fp
	sum := backend.SUM
	l := slotFor(backend.OpAllreduce, tensor.Float32, &sum, 2, -1)
	other := slotFor(backend.OpAllreduce, tensor.Float32, &sum, 3, -1)
	peer := func(seq uint64, s fpSlot) {
		s.ahead = true
		bs[1].r.put(1, seq, s)
	}

	// Ten ops, all but the last two completed unchecked; rank 1 agrees.
	var waiting []*handle
	for seq := range uint64(10) {
		if h := r0.postAhead(seq, l, seq < 8); seq >= 8 {
			waiting = append(waiting, h)
		}
		peer(seq, l)
	}
	r0.b.fpVerifyLocked()
	if len(g.ver) != 0 || g.chk != 10 || bs[1].r.checked(0).Load() != 10 {
		t.Fatalf("after an agreeing batch of 10: %d entries left, chk %d, checked word %d; want 0, 10, 10", len(g.ver), g.chk, bs[1].r.checked(0).Load())
	}
	for _, h := range waiting {
		if h.IsCompleted() || h.rec.fpw.ahead {
			t.Fatalf("a waiting work after its check: completed %v, still ahead %v; want it checked and left to UCC", h.IsCompleted(), h.rec.fpw.ahead)
		}
	}

	// A batch across the end of the ring (fpSlots) is checked in one look.
	g.chk, g.ver = fpSlots-4, g.ver[:0]
	for seq := uint64(fpSlots - 4); seq < fpSlots+4; seq++ {
		r0.postAhead(seq, l, true)
		peer(seq, l)
	}
	if n := r0.b.fpAgreeLocked(); n != 8 {
		t.Fatalf("a batch of 8 across the ring's end: gu_fp_agree agrees on %d, want 8", n)
	}
	r0.b.fpVerifyLocked()
	if len(g.ver) != 0 || g.chk != fpSlots+4 {
		t.Fatalf("after the batch across the ring's end: %d entries left, chk %d; want 0, %d", len(g.ver), g.chk, fpSlots+4)
	}
	g.chk = 10

	// Rank 1's slot of 12 is not there yet: the check stops before it.
	for seq := uint64(10); seq < 13; seq++ {
		r0.postAhead(seq, l, true)
	}
	peer(10, l)
	peer(11, l)
	r0.b.fpVerifyLocked()
	if len(g.ver) != 1 || g.ver[0].seq != 12 || g.chk != 12 {
		t.Fatalf("with rank 1's slot of 12 missing: entries %v, chk %d; want only 12 left, chk 12", g.ver, g.chk)
	}
	peer(12, l)
	r0.b.fpVerifyLocked()

	// A mismatch on a work that still waits fails it, naming both ranks.
	h := r0.postAhead(13, l, false)
	peer(13, other)
	r0.b.fpVerifyLocked()
	var oe *backend.OpError
	if !h.IsCompleted() || !errors.As(h.err(), &oe) || !errors.Is(oe, backend.ErrInvalidArgument) || len(oe.Ranks) != 2 ||
		!strings.Contains(oe.Detail, "rank 0 allreduce float32 x 2 (SUM), rank 1 allreduce float32 x 3 (SUM)") {
		t.Fatalf("a waiting work against rank 1's mismatch: completed %v, %v; want ErrInvalidArgument naming ranks 0 and 1 and both sizes", h.IsCompleted(), h.err())
	}
	if r0.b.stopped != nil {
		t.Fatalf("a mismatch on a waiting work stopped the backend: %v", r0.b.stopped)
	}

	// Rank 1, held on op 20 with another size, sees rank 0's slot posted
	// ahead: no stand-in before rank 0 has checked 20.
	r0.postAhead(20, l, false)
	bs[1].r.put(1, 20, other)
	if un := r1.b.fpUnackedLocked(20); len(un) != 1 || un[0] != 0 {
		t.Fatalf("rank 1's stand-in for 20 waits for %v before rank 0 checked it (rank 0's count %d); want [0]", un, bs[0].r.checked(0).Load())
	}
	if un := r1.b.fpUnackedLocked(19); un != nil {
		t.Fatalf("rank 1 waits for %v to check 19, which rank 0 did not post ahead", un)
	}
	g.ver = g.ver[:0]
	g.chk = 21
	bs[0].checked(21)
	if un := r1.b.fpUnackedLocked(20); un != nil {
		t.Fatalf("rank 1 still waits for %v once rank 0 has checked 20", un)
	}

	// A mismatch in an op that completed unchecked: the rule broke.
	r0.postAhead(21, l, true)
	r0.postAhead(22, l, true)
	peer(21, l)
	peer(22, other)
	r0.b.fpVerifyLocked()
	if err := r0.b.usableLocked(backend.OpAllreduce, 24); !errors.Is(err, backend.ErrAborted) || !strings.Contains(err.Error(), "op number 22 completed before its fingerprint check") {
		t.Fatalf("after a mismatch in an op completed unchecked, the next op: %v; want ErrAborted naming op 22", err)
	}
}
