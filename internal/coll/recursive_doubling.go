package coll

import (
	"context"
	"math/bits"

	"github.com/gocoll/gocoll/internal/reduce"
)

// allreduceRD is recursive doubling. With a world size that is not a power
// of two, the first 2*rem ranks fold pairwise into rem ranks first and get
// the result back at the end (MPICH's scheme).
func allreduceRD(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	p := 1 << (bits.Len(uint(n)) - 1)
	rem := n - p
	scratch := c.get(len(buf))
	defer c.put(scratch)
	newrank := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := t.Send(ctx, r+1, tag, buf); err != nil {
				return err
			}
			newrank = -1
		} else {
			if err := t.Irecv(r-1, tag, scratch).Wait(ctx); err != nil {
				return err
			}
			k.Combine(buf, scratch)
			newrank = r / 2
		}
	}
	if newrank >= 0 {
		for mask := 1; mask < p; mask <<= 1 {
			nd := newrank ^ mask
			dst := nd + rem
			if nd < rem {
				dst = nd*2 + 1
			}
			q := t.Irecv(dst, tag, scratch)
			if err := t.Send(ctx, dst, tag, buf); err != nil {
				q.Cancel()
				return err
			}
			if err := q.Wait(ctx); err != nil {
				return err
			}
			k.Combine(buf, scratch)
		}
	}
	if r < 2*rem {
		if r%2 == 0 {
			return t.Irecv(r+1, tag, buf).Wait(ctx)
		}
		return t.Send(ctx, r-1, tag, buf)
	}
	return nil
}
