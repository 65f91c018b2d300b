package coll

import (
	"context"
)

// Alltoall sends in[i] to rank i and receives rank i's message into out[i]
// by pairwise exchange: at step s rank r sends to r+s and receives from
// r-s. Sizes may differ per pair; both sides pass matching sizes.
func Alltoall(ctx context.Context, c *Comm, tag uint64, out, in [][]byte) error {
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
