package ucc

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/internal/tcpmesh"
)

// The fingerprint board. UCC's wire is UCC's: nothing gocoll can put a
// fingerprint into, so a float32 allreduce against an int32 one of the
// same size silently sums the wrong bits, and ops of different sizes hang
// or fail obscurely inside UCC. Before an op reaches UCC, every rank
// publishes its op's fingerprint (op, dtype, reduce op, element count,
// root: 32 bytes) under the op's number on the board, and posts the op
// only once every peer's fingerprint for that number is there and equal;
// otherwise every rank fails the op with ErrInvalidArgument in the same
// words (internal/opcheck, cpupool's) and UCC never sees it.
//
// The board is a ring of fpSlots slots per rank. A rank writes only its
// own ring, the fingerprint words first and then the slot's number (with
// an atomic store, which orders the words before it), and reads the
// peers' rings with atomic loads. Each rank also publishes how many
// numbers it has checked (read every peer's slot of); a rank may write
// number n only once every peer has checked n-fpSlots, so that no slot is
// overwritten before all have read it. The memory is a /dev/shm file
// mapped by every rank of one host (fpshm.go) or, for ranks on different
// hosts, this process's heap with the peers' slots filled from a TCP side
// channel (fptcp.go); the unit tests use the heap (fpboard_test.go).

// fpSlots is the ring length per rank: how far one rank may issue ahead
// of the slowest peer's check before its publications wait (they wait in
// the progress loop, never in the caller).
const fpSlots = 512

// fpSlot is what a rank publishes about one op.
type fpSlot struct {
	fp   tcpmesh.Fingerprint
	root int32 // the op's root rank; -1: the op has none
	// ahead: the rank posted the op to UCC at issue, before its peers'
	// fingerprints came (fpahead.go). Not part of the op: judge and the
	// C comparison leave it out.
	ahead bool
}

// words packs s into the two data words of a slot.
func (s fpSlot) words() (w1, w2 uint64) {
	w1 = uint64(s.fp.Op) | uint64(s.fp.DType)<<8 | uint64(s.fp.ReduceOp)<<16 | uint64(uint32(s.root))<<32
	if s.ahead {
		w1 |= fpAheadBit
	}
	return w1, s.fp.Count
}

func slotOf(w1, w2 uint64) fpSlot {
	return fpSlot{fp: tcpmesh.Fingerprint{Op: uint8(w1), DType: uint8(w1 >> 8), ReduceOp: uint8(w1 >> 16), Count: w2},
		root: int32(uint32(w1 >> 32)), ahead: w1&fpAheadBit != 0}
}

// The board's layout: a 64-byte header (magic, ranks, slots), then per
// rank a 64-byte header (its pid, how many numbers it has checked) and
// its ring of 32-byte slots (the number + 1, 0 while empty; the two data
// words; one spare).
const (
	fpMagic    = 0x3170_6f62_6363_7567 // "gucc" "bop1"
	fpHdr      = 64
	fpRankHdr  = 64
	fpSlotSize = 32
)

func fpRankBytes(k int) int     { return fpRankHdr + k*fpSlotSize }
func fpBoardBytes(n, k int) int { return fpHdr + n*fpRankBytes(k) }

// fpRings is the board's memory: n rings of k slots.
type fpRings struct {
	mem  []byte
	n, k int
}

// newRings lays a fresh board of n rings of k slots out in mem (zeroed,
// 8-byte aligned, fpBoardBytes(n, k) long).
func newRings(mem []byte, n, k int) *fpRings {
	r := &fpRings{mem: mem, n: n, k: k}
	r.word(8).Store(uint64(n))
	r.word(16).Store(uint64(k))
	r.word(0).Store(fpMagic) // last: openRings checks it
	return r
}

// openRings reads the layout of a board another rank laid out.
func openRings(mem []byte) (*fpRings, error) {
	if len(mem) < fpHdr {
		return nil, fmt.Errorf("ucc: the fingerprint board is %d bytes, too small", len(mem))
	}
	r := &fpRings{mem: mem}
	if r.word(0).Load() != fpMagic {
		return nil, errors.New("ucc: the fingerprint board has no gocoll header")
	}
	r.n, r.k = int(r.word(8).Load()), int(r.word(16).Load())
	if r.n <= 0 || r.k <= 0 || fpBoardBytes(r.n, r.k) != len(mem) {
		return nil, fmt.Errorf("ucc: the fingerprint board's layout (%d ranks, %d slots) does not fit its %d bytes", r.n, r.k, len(mem))
	}
	return r, nil
}

func (r *fpRings) word(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[off]))
}

func (r *fpRings) rankWord(rank, off int) *atomic.Uint64 {
	return r.word(fpHdr + rank*fpRankBytes(r.k) + off)
}

func (r *fpRings) slotWord(rank int, seq uint64, w int) *atomic.Uint64 {
	return &r.slot(rank, seq)[w]
}

// slot is rank's slot of seq: its number word and two data words (and
// the spare). Why one address for the three words: put and get took a
// 64-bit division (seq modulo the ring's length, which the board's header
// gives, so no constant) and a bounds check per word, a few percent of a
// 2-rank 8 B op; the rings fpSetup makes are fpSlots long, a power of two,
// which takes a mask.
func (r *fpRings) slot(rank int, seq uint64) *[4]atomic.Uint64 {
	var i uint64
	if k := uint64(r.k); k&(k-1) == 0 {
		i = seq & (k - 1)
	} else {
		i = seq % k
	}
	off := fpHdr + rank*fpRankBytes(r.k) + fpRankHdr + int(i)*fpSlotSize
	return (*[4]atomic.Uint64)(unsafe.Pointer(&r.mem[off : off+fpSlotSize][0]))
}

// pid is the word where rank's process id is kept.
func (r *fpRings) pid(rank int) *atomic.Uint64 { return r.rankWord(rank, 0) }

// checked is the word where rank publishes how many numbers it has
// checked.
func (r *fpRings) checked(rank int) *atomic.Uint64 { return r.rankWord(rank, 8) }

// put writes rank's slot of seq: the words, then the number.
func (r *fpRings) put(rank int, seq uint64, s fpSlot) {
	w1, w2 := s.words()
	sl := r.slot(rank, seq)
	sl[1].Store(w1)
	sl[2].Store(w2)
	sl[0].Store(seq + 1)
}

// get reads rank's slot of seq, if it is there.
func (r *fpRings) get(rank int, seq uint64) (fpSlot, bool) {
	sl := r.slot(rank, seq)
	if sl[0].Load() != seq+1 {
		return fpSlot{}, false
	}
	return slotOf(sl[1].Load(), sl[2].Load()), true
}

// room returns how far rank may write: the lowest of the other ranks'
// checked numbers plus k (seq may be written when below it).
func (r *fpRings) room(rank int) uint64 {
	free := uint64(1<<64 - 1)
	for p := range r.n {
		if p != rank {
			free = min(free, r.checked(p).Load()+uint64(r.k))
		}
	}
	return free
}

// heapRings is a board in this process's memory (the TCP side channel's,
// and the unit tests').
func heapRings(n, k int) *fpRings {
	words := make([]uint64, fpBoardBytes(n, k)/8)
	return newRings(unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8), n, k)
}

// fpBoard is the transport of the fingerprints: a board in shared memory
// (fpshm.go), over TCP (fptcp.go), or a test double.
type fpBoard interface {
	// post publishes this rank's slot of seq; false: no room yet (a peer
	// has not checked seq - fpSlots), try again later. It never blocks.
	post(seq uint64, s fpSlot) bool
	// peek reads peer's slot of seq, if it is there.
	peek(peer int, seq uint64) (fpSlot, bool)
	// checked records that this rank has read every peer's slot of the
	// numbers below n.
	checked(n uint64)
	// gone is non-nil once peer can publish nothing more (its process
	// exited, its channel broke): why, and the rank to blame (peer, or
	// the rank whose death broke peer's channel too).
	gone(peer int) (culprit int, err error)
	// kind names the transport for the logs and docs ("shm", "tcp").
	kind() string
	// close releases the board; nothing may use it after.
	close() error
}

// fpVerdict is the outcome of one op's check.
type fpVerdict struct {
	kind   error  // nil: every rank agrees; else the sentinel to fail with
	detail string // the words, the same on every rank
	ranks  []int  // the ranks at odds
}

// judge compares every rank's slot of seq (this rank's is mine) and
// reports done once all are there. The rule is the same on every rank
// and reads only what every rank reads, so every rank reaches the same
// verdict in the same words: the lowest rank whose op differs from rank
// 0's, else agreement.
func judge(b fpBoard, rank, size int, seq uint64, mine fpSlot) (v fpVerdict, done bool) {
	slots := make([]fpSlot, 0, 8)
	for p := range size {
		s := mine
		if p != rank {
			var ok bool
			if s, ok = b.peek(p, seq); !ok {
				return fpVerdict{}, false
			}
		}
		slots = append(slots, s)
	}
	f0 := slots[0]
	for p, s := range slots[1:] {
		p++
		switch {
		case fpDiffer(f0.fp, s.fp):
			return fpVerdict{kind: backend.ErrInvalidArgument, ranks: []int{0, p}, detail: opcheck.Detail(0, f0.fp, p, s.fp)}, true
		case f0.root != s.root:
			return fpVerdict{kind: backend.ErrInvalidArgument, ranks: []int{0, p},
				detail: opcheck.RootDetail(0, f0.fp, int(f0.root), p, int(s.root))}, true
		}
	}
	return fpVerdict{}, true
}

// fpDiffer reports whether two ranks' fingerprints of one op disagree
// (a count of tcpmesh.AnyCount agrees with any count).
func fpDiffer(f, g tcpmesh.Fingerprint) bool {
	if f.Op != g.Op || f.DType != g.DType || f.ReduceOp != g.ReduceOp {
		return true
	}
	return f.Count != g.Count && f.Count != tcpmesh.AnyCount && g.Count != tcpmesh.AnyCount
}

// missing lists the peers whose slot of seq is not there, and says why
// for those that are gone.
func missing(b fpBoard, rank, size int, seq uint64) (ranks []int, why []string) {
	for p := range size {
		if p == rank {
			continue
		}
		if _, ok := b.peek(p, seq); !ok {
			ranks = append(ranks, p)
			if _, err := b.gone(p); err != nil {
				why = append(why, err.Error())
			}
		}
	}
	return ranks, why
}
