package coll

import (
	"context"
)

// gatherTree is Gather along a binomial tree rooted at root: a rank
// collects its subtree's blocks, relative rank order, into one buffer and
// sends it to its parent in one message; root rotates the result into
// absolute rank order.
func gatherTree(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	B := len(in)
	vr := mod(r-root, n)
	sub := min(lowbit(vr, n), n-vr)
	tmp := out
	if vr != 0 || root != 0 {
		tmp = c.get(sub * B)
		defer c.put(tmp)
	}
	copy(tmp, in)
	var pending reqs
	defer pending.cancel()
	for mask := 1; mask < n && vr&mask == 0; mask <<= 1 {
		if child := vr + mask; child < n {
			cnt := min(mask, n-child)
			pending.push(t.Irecv(mod(child+root, n), tag, tmp[mask*B:(mask+cnt)*B]))
		}
	}
	for len(pending.q) > 0 {
		if err := pending.wait(ctx); err != nil {
			return err
		}
	}
	if vr != 0 {
		return t.Send(ctx, mod(vr-lowbit(vr, n)+root, n), tag, tmp[:sub*B])
	}
	if root != 0 { // rotate from relative to absolute rank order
		for v := 0; v < n; v++ {
			copy(out[mod(v+root, n)*B:], tmp[v*B:(v+1)*B])
		}
	}
	return nil
}
