package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// reduceTree is Reduce along a binomial tree rooted at root: each rank
// combines its children's segments into its buf (through a window of
// scratch slots) and sends each finished segment to its parent, so that
// receiving, combining and sending overlap.
func reduceTree(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel, root int) error {
	t := c.T
	n, r := t.Size(), t.Rank()
	vr := mod(r-root, n)
	var children []int
	parent := -1
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			parent = mod(vr-mask+root, n)
			break
		}
		if vr+mask < n {
			children = append(children, mod(vr+mask+root, n))
		}
	}
	seg := c.seg(k.ElemSize)
	nseg := (len(buf) + seg - 1) / seg
	total := nseg * len(children)
	w := c.window()
	var slots []byte
	if total > 0 {
		slots = c.get(w * seg)
		defer c.put(slots)
	}
	var pending reqs
	defer pending.cancel()
	posted, done := 0, 0
	piece := func(i int) []byte { // segment of receive i
		off := (i / max(len(children), 1)) * seg
		return buf[off:min(off+seg, len(buf))]
	}
	post := func() {
		for posted < total && posted-done < w {
			p := piece(posted)
			slot := posted % w
			pending.push(t.Irecv(children[posted%len(children)], tag, slots[slot*seg:slot*seg+len(p)]))
			posted++
		}
	}
	post()
	for j := 0; j < nseg; j++ {
		for range children {
			if err := pending.wait(ctx); err != nil {
				return err
			}
			p := piece(done)
			slot := done % w
			k.Combine(p, slots[slot*seg:slot*seg+len(p)])
			done++
			post()
		}
		if parent >= 0 {
			off := j * seg
			if err := t.Send(ctx, parent, tag, buf[off:min(off+seg, len(buf))]); err != nil {
				return err
			}
		}
	}
	return nil
}
