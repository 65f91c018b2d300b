package shm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// Stamped frames: the small-message protocol of a ring that carries one
// frame per message, read by the op that waits for it (tcpmesh's lanes).
//
// A plain Write publishes by moving tail, which the reader polls: a
// message then moves at least three cache lines between the cores (tail
// to the reader, the data to the reader, and head back to the writer,
// which reads it on every write to see the free space). A stamped frame
// carries its own ready mark instead: its first 8 bytes, written last, are
// the stamp of the frame's position in the stream (StampAt), so the reader
// polls the line it will read anyway, and the writer looks at head only
// when its cached view of the free space runs out. A small frame then
// moves one line each way, as Open MPI's shared-memory fast boxes do.
//
// Tail still moves with every frame, so Buffered, Await, Peek and
// PeekStable see stamped frames as any others; the lines it lives on stay
// in the writer's cache as long as nobody polls them. A ring must carry
// stamped frames only, or none: the reader of stamped frames expects one
// at its head.
//
// The stamp of position p is (p XOR key) | 1, with key random per pair
// (the creator draws it): never zero (fresh memory), never the stamp of
// the same offset one lap earlier (p and p - size differ above the ring's
// size), and no value a tensor's bytes from an earlier lap would hold but
// by a chance of 2^-63.

// offKey is where the pair file keeps the stamps' key, in the header
// page after the magic and the ring size.
const offKey = 16

// StampAlign is the alignment the writer of stamped frames keeps them at
// (a frame's length is a multiple of it): every frame starts a cache line,
// so a small one occupies one line alone.
const StampAlign = 64

// stampOf is the stamp of the frame at stream position p.
func (r *Ring) stampOf(p uint64) uint64 { return (p ^ r.key) | 1 }

// stampWord is the stamp word at stream position p (8-aligned, so it never
// straddles the ring's end).
func (r *Ring) stampWord(p uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.data[p&r.mask]))
}

// WriteStamped writes one frame: hdr, whose first 8 bytes are the stamp
// (WriteStamped fills them in, last), then buf, then pad bytes of padding
// (left as they are); the frame's length must be a multiple of
// StampAlign and at most the ring's size. It waits for space as
// WriteCheck does (check as WriteCheck's).
func (r *Ring) WriteStamped(ctx context.Context, hdr, buf []byte, pad int, check func() error) error {
	n := uint64(len(hdr) + len(buf) + pad)
	if len(hdr) < 8 || n > r.size || n%StampAlign != 0 {
		return fmt.Errorf("shm: stamped frame of %d bytes (header %d) in a ring of %d", n, len(hdr), r.size)
	}
	t := r.tail.Load()
	if r.size-(t-r.headCache) < n {
		r.headCache = r.head.Load()
		if r.size-(t-r.headCache) < n {
			if err := r.waitSpace(ctx, n, check); err != nil {
				return err
			}
			r.headCache = r.head.Load()
		}
	}
	r.copyIn(t+8, hdr[8:])
	r.copyIn(t+uint64(len(hdr)), buf)
	// Last: a reader that sees the stamp sees the frame (the atomics
	// order the plain writes before it).
	r.stampWord(t).Store(r.stampOf(t))
	r.publish(t + n)
	return nil
}

// Stamped reports whether the frame at the head is there (stamped).
// Only the consumer may call it.
func (r *Ring) Stamped() bool {
	h := r.head.Load()
	return r.stampWord(h).Load() == r.stampOf(h)
}

// AwaitStamped waits until the frame at the head is there, as Await waits
// for bytes (spin, Yield, slice and check as Await's), looking at the
// frame's stamp rather than at tail. It fails as Await does.
func (r *Ring) AwaitStamped(ctx context.Context, spin, slice time.Duration, check func() error) error {
	h := r.head.Load()
	w, want := r.stampWord(h), r.stampOf(h)
	p := newPacer(spin, r.Yield, r.Budget)
	for i := 0; ; i++ {
		// dead first: a frame written before the peer died is visible
		// once its death is.
		dead := r.dead.Load()
		if w.Load() == want {
			p.ended()
			return nil
		}
		if r.closed.Load() {
			return ErrClosed
		}
		if dead {
			return ErrPeerDead
		}
		if p.poll(i) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("shm: waiting for a frame: %w", err)
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		d := slice
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl)+time.Millisecond)
		}
		r.consWait.Store(1)
		seq := r.dataSeq.Load()
		// Announcing before checking (seq-cst) pairs with publish, which
		// the writer calls after the stamp.
		if w.Load() != want && !r.closed.Load() && !r.dead.Load() {
			p.sleeping()
			futexWait(r.dataSeq, seq, max(d, time.Microsecond))
		}
		r.consWait.Store(0)
	}
}

// FrameAt returns views of the n bytes at offset off into the frame at
// the head: a, and b when they wrap around the ring's end (both at
// 8-byte boundaries of the stream when off is). Valid until Consume;
// only the consumer may call it, once the frame is there.
func (r *Ring) FrameAt(off, n int) (a, b []byte) {
	p := (r.head.Load() + uint64(off)) & r.mask
	if end := p + uint64(n); end <= r.size {
		return r.data[p:end], nil
	}
	return r.data[p:], r.data[:p+uint64(n)-r.size]
}
