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
	// Expect waits until peer's next message is there, as a large op's
	// sync point should: its peers are busy with the same op, so it polls
	// longer than a small op's receive before it parks (a parked wait's
	// wake-up, on a virtual machine whose idle CPU halts, costs hundreds
	// of microseconds). n is the length the message should have, for
	// the error when the peer sent it some other way.
	Expect(ctx context.Context, peer, n int) error
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
			if err := sendChunks(ctx, t, r+1, buf, e); err != nil {
				return err
			}
		} else if err := recvChunks(ctx, t, r-1, buf, e, combine); err != nil {
			return err
		}
	}
	if d.newrank >= 0 {
		for mask := 1; mask < d.p; mask <<= 1 {
			if err := exchangeChunks(ctx, t, d.peer(mask), buf, e, combine); err != nil {
				return err
			}
		}
	}
	if d.folded() {
		if r%2 == 0 {
			return recvChunks(ctx, t, r+1, buf, e, copyRun)
		}
		return sendChunks(ctx, t, r-1, buf, e)
	}
	return nil
}

// LaneChunk bounds the messages of a large lane allreduce: a buffer
// beyond laneWhole goes in even chunks of at most LaneChunk (and less
// than an element more), so that an allreduce may exceed what a lane
// holds, and the peer reduces one chunk while this rank copies in the
// next. Four chunks (and their headers) must fit in a lane:
// exchangeChunks keeps at most four of a rank's chunks unread.
const LaneChunk = 256<<10 - 256

// laneWhole is the largest buffer sent as one message, as before chunks:
// one message (at most half a lane) is one wake-up of the peer, which
// matters when ranks share cores.
const laneWhole = 2 * LaneChunk

// laneStep is the chunk length for a buffer of n bytes of elements of
// elem bytes: a function of n alone, so that both sides cut alike.
func laneStep(n, elem int) int {
	if n <= laneWhole {
		return max(n, 1)
	}
	k := (n + LaneChunk - 1) / LaneChunk
	step := (n + k - 1) / k
	return step + (elem-step%elem)%elem
}

// sendChunks sends buf to peer in chunks.
func sendChunks(ctx context.Context, t Lanes, peer int, buf []byte, elem int) error {
	step := laneStep(len(buf), elem)
	for off := 0; off < len(buf); off += step {
		if err := t.Send(ctx, peer, buf[off:min(off+step, len(buf))]); err != nil {
			return err
		}
	}
	return nil
}

// recvChunks receives sendChunks' chunks from peer into buf with fn.
func recvChunks(ctx context.Context, t Lanes, peer int, buf []byte, elem int, fn func(dst, src []byte)) error {
	step := laneStep(len(buf), elem)
	for off := 0; off < len(buf); off += step {
		if err := recvLarge(ctx, t, peer, buf[off:min(off+step, len(buf))], elem, fn, step < len(buf)); err != nil {
			return err
		}
	}
	return nil
}

// exchangeChunks sends buf to peer and combines peer's buf into it, chunk
// by chunk, the next chunk sent before the current one is received (and
// combined: a chunk is sent before it changes), so that the two ranks copy
// in and reduce at once. It never deadlocks: when this rank sends chunk
// i+1 it has received chunk i-1, so the peer has received (read) this
// rank's chunk i-3 or later, and at most four chunks of this rank are
// unread; the peer is never blocked sending at the same time, since that
// would need this rank to have read chunks it has not.
func exchangeChunks(ctx context.Context, t Lanes, peer int, buf []byte, elem int, fn func(dst, src []byte)) error {
	step := laneStep(len(buf), elem)
	if err := t.Send(ctx, peer, buf[:min(step, len(buf))]); err != nil {
		return err
	}
	for off := 0; off < len(buf); off += step {
		if next := off + step; next < len(buf) {
			if err := t.Send(ctx, peer, buf[next:min(next+step, len(buf))]); err != nil {
				return err
			}
		}
		if err := recvLarge(ctx, t, peer, buf[off:min(off+step, len(buf))], elem, fn, step < len(buf)); err != nil {
			return err
		}
	}
	return nil
}

// recvLarge is t.RecvInto that first waits as a large op should
// (t.Expect) when large: the chunks of a large op, whose wait for the
// peer's next chunk is as long as the peer's share of the op, and which
// would otherwise park after a small op's spin and pay a wake-up.
func recvLarge(ctx context.Context, t Lanes, peer int, buf []byte, elem int, fn func(dst, src []byte), large bool) error {
	if large {
		if err := t.Expect(ctx, peer, len(buf)); err != nil {
			return err
		}
	}
	return t.RecvInto(ctx, peer, buf, elem, fn)
}

// copyRun is a RecvInto fn that copies.
func copyRun(dst, src []byte) { copy(dst, src) }
