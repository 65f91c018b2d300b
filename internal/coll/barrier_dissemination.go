package coll

import (
	"context"
)

// Barrier returns once every rank has entered it: a dissemination barrier
// of empty messages, ceil(log2 n) rounds.
func Barrier(ctx context.Context, c *Comm, tag uint64) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	for k := 1; k < n; k <<= 1 {
		q := t.Irecv(mod(r-k, n), tag, nil)
		if err := t.Send(ctx, mod(r+k, n), tag, nil); err != nil {
			q.Cancel()
			return err
		}
		if err := q.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}
