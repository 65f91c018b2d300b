package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// allreduceRing is allreduce as the two ring phases over n even blocks:
// reduce-scatter (with the size check), then all-gather of the reduced
// blocks. direct is Choice.ReduceOnReceive.
func allreduceRing(ctx context.Context, c *Comm, tag uint64, buf []byte, k reduce.Kernel, direct bool) error {
	blocks := SplitEven(buf, c.T.Size(), k.ElemSize)
	if err := ring(ctx, c, tag, blocks, ringPhase{a: -1, k: &k, check: true, direct: direct}); err != nil {
		return err
	}
	return ring(ctx, c, tag, blocks, ringPhase{a: 0})
}

// ringPhase is what one pass of ring does.
type ringPhase struct {
	// a offsets the blocks: -1 for reduce-scatter (block r ends complete
	// on rank r), 0 for all-gather.
	a int
	// k, when set, combines what arrives into the block (reduce-scatter);
	// nil receives straight into it (all-gather).
	k *reduce.Kernel
	// check exchanges total sizes first (sizeCheck).
	check bool
	// direct reduces on receive through the transport's ReduceReceiver
	// (Choice.ReduceOnReceive); only with k.
	direct bool
}

type ringItem struct {
	blk, off, len int
	dep           int // the receive a send waits for; -1 for none
}

// ring runs n-1 steps around the ring: at step s rank r sends block
// (r-s+a) to its right and receives block (r-s-1+a) from its left. With a
// kernel it receives into scratch slots and combines into the block, or
// with direct has the transport combine as it reads (the reduce-scatter
// phase, a = -1, leaving block r complete on rank r); without, it
// receives straight into the block (the all-gather phase, a = 0). Blocks
// are cut into segments; the send of a segment at step s+1 follows as soon
// as that segment has been received at step s, so sending, receiving and
// reducing overlap.
//
// With check, the ring first exchanges total sizes (sizeCheck) and fails
// with a *SizeError before it uses any received data if they differ.
func ring(ctx context.Context, c *Comm, tag uint64, blocks [][]byte, ph ringPhase) error {
	a, k := ph.a, ph.k
	t := c.T
	n, r := t.Size(), t.Rank()
	right, left := mod(r+1, n), mod(r-1, n)
	elem := 1
	if k != nil {
		elem = k.ElemSize
	}
	seg := c.seg(elem)
	var sends, recvs []ringItem
	recvStart := make([]int, n)
	for s := 0; s < n-1; s++ {
		sb := mod(r-s+a, n)
		rb := mod(r-s-1+a, n)
		for j, off := 0, 0; off < len(blocks[sb]); j, off = j+1, off+seg {
			dep := -1
			if s > 0 {
				dep = recvStart[s-1] + j
			}
			sends = append(sends, ringItem{sb, off, min(seg, len(blocks[sb])-off), dep})
		}
		recvStart[s] = len(recvs)
		for off := 0; off < len(blocks[rb]); off += seg {
			recvs = append(recvs, ringItem{rb, off, min(seg, len(blocks[rb])-off), -1})
		}
	}
	w := c.window()
	var slots []byte
	var rr ReduceReceiver
	direct := ph.direct && k != nil
	if direct {
		rr = t.(ReduceReceiver)
	}
	if k != nil && !direct {
		slots = c.get(w * seg)
		defer c.put(slots)
	}
	var sc sizeCheck
	if ph.check {
		// Posted before the data receives: messages from one peer under
		// one tag match in posting order, so the size comes first.
		if err := sc.start(ctx, t, tag, total(blocks)); err != nil {
			return err
		}
		defer sc.cancel()
	}
	var pending reqs
	defer pending.cancel()
	posted, done, si := 0, 0, 0
	post := func() {
		for posted < len(recvs) && (k == nil || posted-done < w) {
			it := recvs[posted]
			switch {
			case direct: // combined into the block as it arrives
				pending.push(rr.IrecvReduce(left, tag, blocks[it.blk][it.off:it.off+it.len], k.ElemSize, k.Combine))
			case k != nil:
				slot := posted % w
				pending.push(t.Irecv(left, tag, slots[slot*seg:slot*seg+it.len]))
			default:
				pending.push(t.Irecv(left, tag, blocks[it.blk][it.off:it.off+it.len]))
			}
			posted++
		}
	}
	post()
	for done < len(recvs) || si < len(sends) {
		for si < len(sends) && sends[si].dep < done && si-done < w {
			it := sends[si]
			if err := t.Send(ctx, right, tag, blocks[it.blk][it.off:it.off+it.len]); err != nil {
				return err
			}
			si++
		}
		if done < len(recvs) {
			if sc.q != nil {
				if err := sc.finish(ctx, t); err != nil {
					return err
				}
			}
			if err := pending.wait(ctx); err != nil {
				return err
			}
			if k != nil && !direct {
				it := recvs[done]
				slot := done % w
				k.Combine(blocks[it.blk][it.off:it.off+it.len], slots[slot*seg:slot*seg+it.len])
			}
			done++
			post()
		}
	}
	return nil
}
