package coll

import (
	"context"
)

// alltoallPairwise is Alltoall by pairwise exchange: every receive is
// posted first, then at step s rank r sends to r+s (the peer that receives
// from r-s at that step), so n-1 sends proceed without waiting on each
// other.
func alltoallPairwise(ctx context.Context, c *Comm, tag uint64, out, in [][]byte) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	copy(out[r], in[r])
	var pending reqs
	defer pending.cancel()
	for s := 1; s < n; s++ {
		src := mod(r-s, n)
		pending.push(t.Irecv(src, tag, out[src]))
	}
	for s := 1; s < n; s++ {
		dst := mod(r+s, n)
		if err := t.Send(ctx, dst, tag, in[dst]); err != nil {
			return err
		}
	}
	for len(pending.q) > 0 {
		if err := pending.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}
