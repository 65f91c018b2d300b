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

const (
	// directChunk is the least a direct allreduce's owner reduces before
	// it tells the others that they may read it: small enough that the
	// readers start early (and read it while it is in the owner's cache),
	// large enough that the notices cost little.
	directChunk = 512 << 10
	// directChunkPair is directChunk between two ranks, each on a core
	// of its own: both reduce their blocks at once, so the gather gains
	// little from starting early, and a read of 8 MiB in one
	// process_vm_readv runs at 10-13.6 GB/s where 512 KiB pieces take
	// 6.5-8.4 (two processes reading each other at once, this host). At
	// 2 ranks, 16 MiB took 0.78x the time and 64 MiB 0.88x; at 3 and 4
	// ranks on 2 cores, where the ranks take turns, it lost
	// (docs/perf.md, issue 17, tenth pass).
	directChunkPair = 8 << 20
	// directChunks bounds the chunks of a block, so that the notices a
	// rank sends while it reduces, which the others read only when they
	// gather, always fit in its lanes.
	directChunks = 64
	// directPiece is how much of a peer's block AllreduceDirect reads
	// before it reduces it (its scratch): small enough to stay in cache.
	directPiece = 512 << 10
	// directPiecePair is directPiece between two ranks, each on a core of
	// its own: one process_vm_readv of 2 MiB moves 9-11 GB/s where
	// 512 KiB pieces move 6.5-8.4 (as for directChunkPair), and 2 MiB
	// still reduces from the last-level cache: 4 MiB took 0.93x the time
	// and 64 MiB 0.88x (medians of 8 rounds taking turns, docs/perf.md,
	// issue 17, eleventh pass). With more ranks the rounds disagreed.
	directPiecePair = 2 << 20
)

// DirectPiece is the scratch length AllreduceDirect wants in a group of
// ranks: the length of the pieces it reads a peer's block in.
func DirectPiece(ranks int) int {
	if ranks == 2 {
		return directPiecePair
	}
	return directPiece
}

// directStep is the chunk length of a block of n bytes of elements of
// elem bytes in a group of ranks: a function of n and ranks alone, so
// that every rank cuts every block the same way.
func directStep(n, elem, ranks int) int {
	least := directChunk
	if ranks == 2 {
		least = directChunkPair
	}
	step := max(least, (n+directChunks-1)/directChunks)
	return step + (elem-step%elem)%elem
}

// AllreduceDirect is a large allreduce between ranks of one host by direct
// reads. Every rank sends its buffer's address over the lanes. Rank r owns
// block r (SplitEven's): chunk by chunk, it reduces that chunk of every
// peer's buffer into its own, reading the peer's bytes in pieces of
// len(scratch) straight from its memory into cache, and then tells every
// peer that the chunk is done. Then it gathers: from each peer q in turn
// (starting at r+1, so that the owners are read evenly), it reads q's
// reduced chunks into its own block q as q announces them, and tells q
// when it is done with it; it returns once every peer is done with it, so
// every buffer stays in place while it is read.
//
// Each byte crosses between processes once (a ring writes it into shared
// memory and reads it out), the reduction reads the peer's piece from
// cache, every block is reduced once, by its owner, so every rank ends
// with the same bits, and there is no barrier: a rank gathers a chunk as
// soon as its owner has reduced it. The order is safe: rank q reads chunk
// c of r's block q before it announces c, and r overwrites that chunk of
// its block q only after the announcement; r reads q's block r (phase 1)
// and q's block q (gather) before it tells q that it is done, and q does
// not return before it has heard that from every peer.
func AllreduceDirect(ctx context.Context, t DirectLanes, buf []byte, k reduce.Kernel, scratch []byte) error {
	n, r := t.Size(), t.Rank()
	if n <= 1 || len(buf) == 0 {
		return nil
	}
	if err := sendAddr(ctx, t, buf); err != nil {
		return err
	}
	addrs, err := recvAddrs(ctx, t)
	if err != nil {
		return err
	}
	e := k.ElemSize
	blocks := SplitEven(buf, n, e)
	offs := blockOffsets(blocks)
	piece := len(scratch) - len(scratch)%e
	blk := blocks[r]
	step := directStep(len(blk), e, n)
	for c := 0; c < len(blk); c += step {
		end := min(c+step, len(blk))
		for i := 1; i < n; i++ {
			p := (r + i) % n
			for off := c; off < end; off += piece {
				l := min(piece, end-off)
				if err := t.ReadPeer(p, scratch[:l], addrs[p]+offs[r]+uintptr(off)); err != nil {
					return err
				}
				k.Combine(blk[off:off+l], scratch[:l])
			}
		}
		for p := range n {
			if p != r {
				if err := t.Send(ctx, p, nil); err != nil {
					return err
				}
			}
		}
	}
	for i := 1; i < n; i++ {
		p := (r + i) % n
		b := blocks[p]
		step := directStep(len(b), e, n)
		for c := 0; c < len(b); c += step {
			if err := recvNotice(ctx, t, p); err != nil {
				return err
			}
			end := min(c+step, len(b))
			if err := t.ReadPeer(p, b[c:end], addrs[p]+offs[p]+uintptr(c)); err != nil {
				return err
			}
		}
		if err := t.Send(ctx, p, nil); err != nil {
			return err
		}
	}
	return recvNotices(ctx, t)
}

// sendAddr sends buf's address to every peer: the op's first message, so
// that they can read buf straight from this process's memory.
func sendAddr(ctx context.Context, t DirectLanes, buf []byte) error {
	var me [8]byte
	binary.LittleEndian.PutUint64(me[:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))))
	return sendToPeers(ctx, t, me[:])
}

// recvAddrs receives every peer's buffer address (sendAddr's), indexed by
// rank; its own entry stays 0.
func recvAddrs(ctx context.Context, t DirectLanes) ([]uintptr, error) {
	addrs := make([]uintptr, t.Size())
	for p := range addrs {
		if p == t.Rank() {
			continue
		}
		if err := t.Expect(ctx, p, 8); err != nil {
			return nil, err
		}
		if err := t.Recv(ctx, p, 8, 8, func(_ int, src []byte) { addrs[p] = uintptr(binary.LittleEndian.Uint64(src)) }); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// blockOffsets returns each block's offset in the buffer the blocks split.
func blockOffsets(blocks [][]byte) []uintptr {
	offs := make([]uintptr, len(blocks))
	for i := 1; i < len(blocks); i++ {
		offs[i] = offs[i-1] + uintptr(len(blocks[i-1]))
	}
	return offs
}

// sendToPeers sends msg to every peer in rank order.
func sendToPeers(ctx context.Context, t DirectLanes, msg []byte) error {
	for p := range t.Size() {
		if p != t.Rank() {
			if err := t.Send(ctx, p, msg); err != nil {
				return err
			}
		}
	}
	return nil
}

// recvNotices receives every peer's next notice (recvNotice's).
func recvNotices(ctx context.Context, t DirectLanes) error {
	for p := range t.Size() {
		if p != t.Rank() {
			if err := recvNotice(ctx, t, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// recvNotice receives peer's next empty message (a chunk done, or done
// reading) with a large op's wait.
func recvNotice(ctx context.Context, t DirectLanes, peer int) error {
	if err := t.Expect(ctx, peer, 0); err != nil {
		return err
	}
	return t.Recv(ctx, peer, 0, 1, func(int, []byte) {})
}
