package tcpmesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMismatch is a data frame of an op that the sender and this rank
// describe differently (Fingerprint): the ranks passed different ops,
// dtypes, reduce ops or element counts to one collective.
var ErrMismatch = errors.New("tcpmesh: the ranks disagree on the op")

// Fingerprint is what every data frame of an op says about it in its
// header, so that a receiver finds ranks that disagree on the op before
// it reads (or reduces) the payload, instead of combining float32 bits
// with int32 ones. The mesh gives the numbers no meaning: the backend
// numbers its ops, dtypes and reduce ops; Op 0 is "no fingerprint".
type Fingerprint struct {
	Op       uint8  // the backend's op number + 1; 0: the frame is not checked
	DType    uint8  // the backend's dtype number
	ReduceOp uint8  // the backend's reduce op number, 0 where none
	Count    uint64 // the op's element count (the same on every rank); AnyCount: not compared
}

// AnyCount is a Fingerprint.Count that is not compared: an op whose
// ranks legitimately pass different counts (all-to-all).
const AnyCount = math.MaxUint64

// mismatch reports whether two fingerprints of one tag disagree; a side
// without a fingerprint agrees with anything.
func (f Fingerprint) mismatch(g Fingerprint) bool {
	if f.Op == 0 || g.Op == 0 {
		return false
	}
	if f.Op != g.Op || f.DType != g.DType || f.ReduceOp != g.ReduceOp {
		return true
	}
	return f.Count != g.Count && f.Count != AnyCount && g.Count != AnyCount
}

// put writes f into a frame header (bytes 1-3 and 24-31).
func (f Fingerprint) put(h []byte) {
	h[1], h[2], h[3] = f.Op, f.DType, f.ReduceOp
	binary.LittleEndian.PutUint64(h[24:], f.Count)
}

// fingerprintOf reads a frame header's fingerprint.
func fingerprintOf(h []byte) Fingerprint {
	return Fingerprint{Op: h[1], DType: h[2], ReduceOp: h[3], Count: binary.LittleEndian.Uint64(h[24:])}
}

// MismatchError is a receive whose message came from a rank that
// described the op differently: the ranks passed different collectives
// (or dtypes, reduce ops, sizes) under one tag. It wraps ErrMismatch.
type MismatchError struct {
	Rank   int // the sender
	Tag    uint64
	Theirs Fingerprint
	Ours   Fingerprint
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v: tag %d: rank %d sent op %d dtype %d reduce op %d count %d; this rank has op %d dtype %d reduce op %d count %d",
		ErrMismatch, e.Tag, e.Rank, e.Theirs.Op, e.Theirs.DType, e.Theirs.ReduceOp, e.Theirs.Count,
		e.Ours.Op, e.Ours.DType, e.Ours.ReduceOp, e.Ours.Count)
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// fingerprintFor returns the fingerprint of the op that ctx runs (BeginOp
// with OpPoll.FP set) when tag is its tag.
func fingerprintFor(ctx context.Context, tag uint64) Fingerprint {
	if op, ok := ctx.Value(opPollKey{}).(*OpPoll); ok && op.registered && op.Tag == tag {
		return op.FP
	}
	return Fingerprint{}
}
