package coll

import (
	"context"
	"encoding/binary"
	"unsafe"

	"github.com/gocoll/gocoll/internal/reduce"
)

// DirectLanes is Lanes between ranks that may also read each other's
// memory in place (tcpmesh's direct reads).
type DirectLanes interface {
	Lanes
	// ReadPeer copies len(dst) bytes at addr in peer's memory into dst.
	ReadPeer(peer int, dst []byte, addr uintptr) error
}

// AllreduceDirect is a large allreduce between ranks of one host by direct
// reads: every rank sends its buffer's address over the lanes; rank r
// then reduces block r (SplitEven's) of every peer into its own, reading
// each peer's block in pieces of len(scratch) straight from its memory,
// and after a barrier reads every other reduced block from its owner
// into its buffer; a last barrier keeps every buffer in place until all
// have read. Each byte crosses between processes once (a ring writes it
// into shared memory and reads it out), and the reduction reads the
// peer's piece from cache. Every block is reduced once, by its owner, so
// every rank ends with the same bits.
func AllreduceDirect(ctx context.Context, t DirectLanes, buf []byte, k reduce.Kernel, scratch []byte) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	var me [8]byte
	binary.LittleEndian.PutUint64(me[:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))))
	for p := range n {
		if p != r {
			if err := t.Send(ctx, p, me[:]); err != nil {
				return err
			}
		}
	}
	addrs := make([]uintptr, n)
	for p := range n {
		if p != r {
			if err := t.Recv(ctx, p, 8, 8, func(_ int, src []byte) { addrs[p] = uintptr(binary.LittleEndian.Uint64(src)) }); err != nil {
				return err
			}
		}
	}
	blocks := SplitEven(buf, n, k.ElemSize)
	offs := make([]uintptr, n)
	for i := 1; i < n; i++ {
		offs[i] = offs[i-1] + uintptr(len(blocks[i-1]))
	}
	piece := len(scratch) - len(scratch)%k.ElemSize
	blk := blocks[r]
	for p := range n {
		if p == r {
			continue
		}
		for off := 0; off < len(blk); off += piece {
			c := min(piece, len(blk)-off)
			if err := t.ReadPeer(p, scratch[:c], addrs[p]+offs[r]+uintptr(off)); err != nil {
				return err
			}
			k.Combine(blk[off:off+c], scratch[:c])
		}
	}
	if err := barrier(ctx, t); err != nil {
		return err
	}
	for p := range n {
		if p != r && len(blocks[p]) > 0 {
			if err := t.ReadPeer(p, blocks[p], addrs[p]+offs[p]); err != nil {
				return err
			}
		}
	}
	return barrier(ctx, t)
}

// barrier is an empty message to every peer and one from each, over the
// lanes.
func barrier(ctx context.Context, t Lanes) error {
	r, n := t.Rank(), t.Size()
	for p := range n {
		if p != r {
			if err := t.Send(ctx, p, nil); err != nil {
				return err
			}
		}
	}
	for p := range n {
		if p != r {
			if err := t.Recv(ctx, p, 0, 1, func(int, []byte) {}); err != nil {
				return err
			}
		}
	}
	return nil
}
