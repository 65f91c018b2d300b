package coll

import (
	"context"

	"github.com/gocoll/gocoll/internal/reduce"
)

// RSAGMax is the largest block of one round of AllreduceLanesRSAG: each
// of its messages is one block, sent whole, and a lane must hold two of
// them (this round's, and the previous round's or op's last, which its
// reader may not have taken yet), so that a send never waits.
const RSAGMax = laneWhole

// AllreduceLanesRSAG is a reduce-scatter then an allgather over lanes,
// every rank exchanging with every other: rank r sends block q
// (SplitEven's) of its buffer to rank q, combines every peer's block r
// into its own straight out of shared memory, then sends its reduced
// block r to every peer and copies theirs in. Each rank copies in and out
// 2(n-1)/n of the buffer and reduces (n-1)/n of it, against recursive
// doubling's log2(n) whole copies and reductions: less work in all, which
// is what counts when ranks share cores. Every block is reduced once, by
// its owner, so every rank has the same bits. A buffer whose blocks would
// exceed RSAGMax goes in rounds, one after another, each over a segment
// of n blocks of at most RSAGMax bytes.
func AllreduceLanesRSAG(ctx context.Context, t Lanes, buf []byte, k reduce.Kernel) error {
	e := k.ElemSize
	seg := t.Size() * (RSAGMax / e) * e
	for len(buf) > seg {
		if err := rsagRound(ctx, t, buf[:seg], k); err != nil {
			return err
		}
		buf = buf[seg:]
	}
	return rsagRound(ctx, t, buf, k)
}

// rsagRound is one round of AllreduceLanesRSAG, over a buffer whose blocks
// are at most RSAGMax bytes.
func rsagRound(ctx context.Context, t Lanes, buf []byte, k reduce.Kernel) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	e := k.ElemSize
	var bl [8][]byte
	blocks := bl[:0]
	if n <= len(bl) {
		blocks = splitEvenInto(blocks, buf, n, e)
	} else {
		blocks = SplitEven(buf, n, e)
	}
	// Sends go to r+1, r+2, ...; receives come from r-1, r-2, ...: the
	// first message each rank waits for is the first its sender sent.
	for i := 1; i < n; i++ {
		if q := (r + i) % n; len(blocks[q]) > 0 {
			if err := t.Send(ctx, q, blocks[q]); err != nil {
				return err
			}
		}
	}
	if own := blocks[r]; len(own) > 0 {
		for i := 1; i < n; i++ {
			if err := recvLarge(ctx, t, (r-i+n)%n, own, e, k.Combine, true); err != nil {
				return err
			}
		}
		for i := 1; i < n; i++ {
			if err := t.Send(ctx, (r+i)%n, own); err != nil {
				return err
			}
		}
	}
	for i := 1; i < n; i++ {
		if q := (r - i + n) % n; len(blocks[q]) > 0 {
			if err := recvLarge(ctx, t, q, blocks[q], e, copyRun, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// splitEvenInto is SplitEven appending to out.
func splitEvenInto(out [][]byte, buf []byte, n, elem int) [][]byte {
	count := len(buf) / elem
	base, extra := count/n, count%n
	off := 0
	for i := range n {
		l := base
		if i < extra {
			l++
		}
		out = append(out, buf[off:off+l*elem])
		off += l * elem
	}
	return out
}
