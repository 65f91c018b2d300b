package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// Lanes is the fast path of small collectives between ranks of one host
// (tcpmesh's lanes): one op at a time, in issue order on every rank, so a
// message needs no tag matching, and a receive reads (or reduces) the
// payload in place, from shared memory, on the op's goroutine. The
// implementation binds the op (tag, and what it is) to the calls.
type Lanes interface {
	// Rank is this rank, in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// Send sends buf to peer; it returns once buf may be reused.
	Send(ctx context.Context, peer int, buf []byte) error
	// Recv receives peer's message of n bytes and hands it to fn in runs
	// of whole units of unit bytes (off is the run's offset).
	Recv(ctx context.Context, peer int, n, unit int, fn func(off int, src []byte)) error
	// RecvInto receives peer's message of len(buf) bytes and hands it to
	// fn in runs of whole units of unit bytes, each with the part of buf
	// it lands on: Recv whose fn needs no closure over buf (a closure
	// passed through an interface is an allocation per op).
	RecvInto(ctx context.Context, peer int, buf []byte, unit int, fn func(dst, src []byte)) error
}

// AllreduceLanes is recursive doubling over lanes (as allreduceRD, with
// the same fold of a world size that is not a power of two): every
// exchange sends the whole buffer and combines the peer's straight out of
// shared memory, so a small allreduce costs one copy in and one reduction
// per step, and no goroutine wake-up. Every rank computes bit-identical
// results, as Combine is commutative and the partners combine the same
// two operands.
func AllreduceLanes(ctx context.Context, t Lanes, buf []byte, k reduce.Kernel) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	e := k.ElemSize
	combine := k.Combine
	d := planRD(n, r)
	if d.folded() {
		if r%2 == 0 {
			if err := t.Send(ctx, r+1, buf); err != nil {
				return err
			}
		} else if err := t.RecvInto(ctx, r-1, buf, e, combine); err != nil {
			return err
		}
	}
	if d.newrank >= 0 {
		for mask := 1; mask < d.p; mask <<= 1 {
			dst := d.peer(mask)
			if err := t.Send(ctx, dst, buf); err != nil {
				return err
			}
			if err := t.RecvInto(ctx, dst, buf, e, combine); err != nil {
				return err
			}
		}
	}
	if d.folded() {
		if r%2 == 0 {
			return t.RecvInto(ctx, r+1, buf, e, copyRun)
		}
		return t.Send(ctx, r-1, buf)
	}
	return nil
}

// copyRun is a RecvInto fn that copies.
func copyRun(dst, src []byte) { copy(dst, src) }
