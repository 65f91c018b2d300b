package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// AllreduceLanesFlat is an allreduce over lanes in one exchange: every
// rank sends its buffer to every peer, then combines the n contributions
// in rank order, x0, x1, ..., so every rank computes the same bits. own
// is scratch of len(buf) bytes (this rank's contribution is kept there
// while buf accumulates).
//
// It sends n-1 messages where recursive doubling sends log2(n), but it
// waits for its peers once per op rather than once per step. With more
// ranks than cores that is what counts: a wait whose peer is not running
// costs a trip through the scheduler (sched_yield) until it runs, and in
// one exchange every rank that runs finds all it needs of the ranks that
// ran before it. 4 ranks on 2 cores, 8 B: docs/perf.md, issue 17.
func AllreduceLanesFlat(ctx context.Context, t Lanes, buf []byte, k reduce.Kernel, own []byte) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	for i := 1; i < n; i++ {
		if err := t.Send(ctx, (r+i)%n, buf); err != nil {
			return err
		}
	}
	e := k.ElemSize
	if r != 0 {
		copy(own, buf)
		if err := t.RecvInto(ctx, 0, buf, e, copyRun); err != nil {
			return err
		}
	}
	for q := 1; q < n; q++ {
		if q == r {
			k.Combine(buf, own[:len(buf)])
			continue
		}
		if err := t.RecvInto(ctx, q, buf, e, k.Combine); err != nil {
			return err
		}
	}
	return nil
}

// Board is a Lanes whose ranks share a board (tcpmesh's): a message is
// posted once for every peer to read.
type Board interface {
	Lanes
	// BoardPost posts buf as this rank's message of the op.
	BoardPost(ctx context.Context, buf []byte) error
	// BoardRecvInto hands peer's message of the op (this rank's own when
	// peer is its rank) to fn(buf, message); the message has len(buf)
	// bytes.
	BoardRecvInto(ctx context.Context, peer int, buf []byte, fn func(dst, src []byte)) error
}

// AllreduceBoard is AllreduceLanesFlat over a board: each rank posts its
// buffer once, then combines the n contributions in rank order, x0, x1,
// ..., straight from the board, so every rank computes the same bits (and
// the same as AllreduceLanesFlat's). One write per rank and op where the
// lanes take n-1: at 4 ranks on 2 cores and 8 B the lane writes were the
// largest part of the op's own CPU time (docs/perf.md, issue 17, ninth
// pass).
func AllreduceBoard(ctx context.Context, t Board, buf []byte, k reduce.Kernel) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	if err := t.BoardPost(ctx, buf); err != nil {
		return err
	}
	if r != 0 {
		if err := t.BoardRecvInto(ctx, 0, buf, copyRun); err != nil {
			return err
		}
	}
	for q := 1; q < n; q++ {
		if err := t.BoardRecvInto(ctx, q, buf, k.Combine); err != nil {
			return err
		}
	}
	return nil
}
