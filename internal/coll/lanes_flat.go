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
