package coll

import (
	"context"
	"math/bits"

	"github.com/gocoll/gocoll/internal/reduce"
)

// rdPlan is recursive doubling's schedule for rank r of n: with a world
// size that is not a power of two, the first 2*rem ranks fold pairwise
// (the even one sends to the odd one, which takes part for both) and get
// the result back at the end (MPICH's scheme). allreduceRD and
// AllreduceLanes walk it over their own transports.
type rdPlan struct {
	r, p, rem int
	newrank   int // rank among the p that exchange, or -1 for a folded-away even rank
}

func planRD(n, r int) rdPlan {
	p := 1 << (bits.Len(uint(n)) - 1)
	d := rdPlan{r: r, p: p, rem: n - p, newrank: r - (n - p)}
	if d.folded() {
		d.newrank = -1
		if r%2 == 1 {
			d.newrank = r / 2
		}
	}
	return d
}

// folded reports whether r is one of the first 2*rem ranks, which fold
// pairwise before the exchanges and unfold after them.
func (d rdPlan) folded() bool { return d.r < 2*d.rem }

// peer is the rank r exchanges with at step mask (1, 2, 4, ... < p).
func (d rdPlan) peer(mask int) int {
	nd := d.newrank ^ mask
	if nd < d.rem {
		return nd*2 + 1
	}
	return nd + d.rem
}

// allreduceRD is recursive doubling. With a world size that is not a power
// of two, the first 2*rem ranks fold pairwise into rem ranks first and get
// the result back at the end (MPICH's scheme).
func allreduceRD(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel) error {
	t := c.T
	r := t.Rank()
	d := planRD(t.Size(), r)
	scratch := c.get(len(buf))
	defer c.put(scratch)
	if d.folded() {
		if r%2 == 0 {
			if err := t.Send(ctx, r+1, tag, buf); err != nil {
				return err
			}
		} else {
			if err := t.Irecv(r-1, tag, scratch).Wait(ctx); err != nil {
				return err
			}
			k.Combine(buf, scratch)
		}
	}
	if d.newrank >= 0 {
		for mask := 1; mask < d.p; mask <<= 1 {
			dst := d.peer(mask)
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
	if d.folded() {
		if r%2 == 0 {
			return t.Irecv(r+1, tag, buf).Wait(ctx)
		}
		return t.Send(ctx, r-1, tag, buf)
	}
	return nil
}
