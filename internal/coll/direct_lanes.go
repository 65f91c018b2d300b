package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// RawChunk bounds the chunks that AllreduceDirectLanes sends over the
// lanes: four of them (and the notices between them) must fit in a lane,
// since a rank keeps at most four of its raw chunks unread by a peer.
const RawChunk = 128<<10 - 128

// rawStep is the chunk length of AllreduceDirectLanes for blocks of at
// most n bytes of elements of elem bytes: even chunks of at most
// RawChunk (less than an element more), a function of n alone.
func rawStep(n, elem int) int {
	k := max((n+RawChunk-1)/RawChunk, 1)
	step := max((n+k-1)/k, elem)
	return step + (elem-step%elem)%elem
}

// gatherGroup is how many reduced chunks AllreduceDirectLanes reads from
// a peer in one direct read, when that many are announced: larger reads
// pin and copy faster (process_vm_readv 7.1-8.2 GB/s in 128 KiB pieces,
// 9.3 in 512 KiB).
const gatherGroup = 4

// AllreduceDirectLanes is AllreduceDirect with the raw half over the
// lanes: rank r sends chunk i of every peer's block q to q as a lane
// message (a user-space copy, no page pinned), combines the peers' chunk
// i of its block r straight out of the lanes, and announces it; then it
// reads the peers' reduced chunks of their blocks straight from their
// memory into its buffer (direct reads), as they announce them, and
// tells each when it is done with it. It returns once every peer is
// done with it.
//
// The lanes carry, from r to each peer: the address, raw chunks 0 and 1,
// then per round i the notice of chunk i and raw chunk i+2, and at the
// end "done". The receiver takes them in that order: in round i it takes
// the notice of i-2, then raw i. So at most four raw chunks of a rank
// (and a few notices) are unread by a peer, which a lane holds.
//
// Safety, as AllreduceDirect's: r overwrites its block q's chunk j (the
// read of q's reduced chunk) only after q announced it, which q does
// after it combined r's raw chunk j, which r had sent (copied) before;
// a peer reads r's block r only after r announced the chunks read; and
// r returns only when every peer said it is done reading.
func AllreduceDirectLanes(ctx context.Context, t DirectLanes, buf []byte, k reduce.Kernel) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	if err := sendAddr(ctx, t, buf); err != nil {
		return err
	}
	e := k.ElemSize
	blocks := SplitEven(buf, n, e)
	offs := blockOffsets(blocks)
	step := rawStep(len(blocks[0]), e)
	chunks := (len(blocks[0]) + step - 1) / step
	for i := range min(2, chunks) {
		if err := sendRaw(ctx, t, blocks, step, i); err != nil {
			return err
		}
	}
	addrs, err := recvAddrs(ctx, t)
	if err != nil {
		return err
	}
	g := directGather{t: t, blocks: blocks, addrs: addrs, offs: offs, step: step, got: make([]int, n), read: make([]int, n)}
	own := blocks[r]
	for i := range chunks {
		if i >= 2 {
			if err := g.notices(ctx, i-2, false); err != nil {
				return err
			}
		}
		if c := chunkOf(own, step, i); len(c) > 0 {
			for j := 1; j < n; j++ {
				if err := recvLarge(ctx, t, (r-j+n)%n, c, e, k.Combine, true); err != nil {
					return err
				}
			}
		}
		for j := 1; j < n; j++ {
			if err := t.Send(ctx, (r+j)%n, nil); err != nil {
				return err
			}
		}
		if i+2 < chunks {
			if err := sendRaw(ctx, t, blocks, step, i+2); err != nil {
				return err
			}
		}
	}
	for i := max(chunks-2, 0); i < chunks; i++ {
		if err := g.notices(ctx, i, i == chunks-1); err != nil {
			return err
		}
	}
	if err := sendToPeers(ctx, t, nil); err != nil {
		return err
	}
	return recvNotices(ctx, t)
}

// sendRaw sends chunk i of every peer's block to that peer.
func sendRaw(ctx context.Context, t Lanes, blocks [][]byte, step, i int) error {
	n, r := t.Size(), t.Rank()
	for j := 1; j < n; j++ {
		q := (r + j) % n
		if c := chunkOf(blocks[q], step, i); len(c) > 0 {
			if err := t.Send(ctx, q, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// chunkOf is chunk i of b cut in steps of step (empty past its end).
func chunkOf(b []byte, step, i int) []byte {
	lo := min(i*step, len(b))
	return b[lo:min(lo+step, len(b))]
}

// directGather is AllreduceDirectLanes' gather: the peers' announced
// chunks, read from their memory in groups.
type directGather struct {
	t           DirectLanes
	blocks      [][]byte
	addrs, offs []uintptr
	step        int
	got, read   []int // per peer: chunks announced, chunks read
}

// notices takes every peer's notice of chunk i and reads what is due:
// gatherGroup announced chunks at once, or all of them when last.
func (g *directGather) notices(ctx context.Context, i int, last bool) error {
	n, r := g.t.Size(), g.t.Rank()
	for j := 1; j < n; j++ {
		q := (r - j + n) % n
		if err := recvNotice(ctx, g.t, q); err != nil {
			return err
		}
		g.got[q] = i + 1
		if g.got[q]-g.read[q] < gatherGroup && !last {
			continue
		}
		b := g.blocks[q]
		lo, hi := min(g.read[q]*g.step, len(b)), min(g.got[q]*g.step, len(b))
		if hi > lo {
			if err := g.t.ReadPeer(q, b[lo:hi], g.addrs[q]+g.offs[q]+uintptr(lo)); err != nil {
				return err
			}
		}
		g.read[q] = g.got[q]
	}
	return nil
}
