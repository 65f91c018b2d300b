package coll

import (
	"context"
)

// scatterTree is Scatter along a binomial tree rooted at root, the
// reverse of gatherTree: a rank receives its subtree's blocks in one
// message from its parent and forwards each child's share.
func scatterTree(ctx context.Context, c *Comm, tag uint64, in []byte, out []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	B := len(out)
	vr := mod(r-root, n)
	lb := lowbit(vr, n)
	sub := min(lb, n-vr)
	var tmp []byte
	switch {
	case vr == 0 && root == 0:
		tmp = in
	case vr == 0:
		tmp = c.get(n * B)
		defer c.put(tmp)
		for v := 0; v < n; v++ {
			copy(tmp[v*B:(v+1)*B], in[mod(v+root, n)*B:])
		}
	case sub == 1:
		tmp = out // a leaf receives its own block only
	default:
		tmp = c.get(sub * B)
		defer c.put(tmp)
	}
	if vr != 0 {
		if err := t.Irecv(mod(vr-lb+root, n), tag, tmp[:sub*B]).Wait(ctx); err != nil {
			return err
		}
	}
	for mask := lb >> 1; mask > 0; mask >>= 1 {
		if child := vr + mask; child < n {
			cnt := min(mask, n-child)
			if err := t.Send(ctx, mod(child+root, n), tag, tmp[mask*B:(mask+cnt)*B]); err != nil {
				return err
			}
		}
	}
	if sub != 1 || vr == 0 {
		copy(out, tmp[:B])
	}
	return nil
}
