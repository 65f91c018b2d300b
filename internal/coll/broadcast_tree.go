package coll

import (
	"context"
)

// broadcastTree is Broadcast along a binomial tree rooted at root (ranks
// renumbered relative to it, see lowbit): each rank receives from its
// parent and forwards to its children segment by segment, so that an inner
// rank forwards a segment while the next one arrives.
func broadcastTree(ctx context.Context, c *Comm, tag uint64, buf []byte, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	vr := mod(r-root, n)
	lb := lowbit(vr, n)
	seg := c.seg(1)
	var pending reqs
	defer pending.cancel()
	if vr != 0 {
		parent := mod(vr-lb+root, n)
		for off := 0; off < len(buf); off += seg {
			pending.push(t.Irecv(parent, tag, buf[off:min(off+seg, len(buf))]))
		}
	}
	for off := 0; off < len(buf); off += seg {
		if vr != 0 {
			if err := pending.wait(ctx); err != nil {
				return err
			}
		}
		for mask := lb >> 1; mask > 0; mask >>= 1 {
			if vr+mask < n {
				if err := t.Send(ctx, mod(vr+mask+root, n), tag, buf[off:min(off+seg, len(buf))]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
