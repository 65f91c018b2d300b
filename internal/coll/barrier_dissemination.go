package coll

import (
	"context"
)

// barrierDissemination is Barrier as a dissemination barrier: in round k
// rank r sends an empty message to r+2^k and waits for one from r-2^k;
// after ceil(log2 n) rounds every rank has heard, directly or not, from
// every other.
func barrierDissemination(ctx context.Context, c *Comm, tag uint64) error {
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
