package ucc

/*
#include <stdlib.h>
#include <string.h>
#include "ucc_dl.h"
*/
import "C"

import "unsafe"

// Small in-place allreduces go through C memory: UCC gets a slot of a
// slab the backend allocated with malloc, the tensor's bytes are copied in
// at issue and back at completion, and nothing of the Go heap is pinned.
//
// Why: a buffer UCC keeps after the issue crossing must be pinned
// (runtime.Pinner: the cgo rule for a pointer C holds after the call), and
// a Pin and its Unpin take the span's lock and a special record each:
// about 120 ns per op on the dev machine, a tenth of the whole op of the
// raw libucc loop at 8 B, where copying 8 bytes twice costs nothing.
// Ops up to smallBytes take it while a slot is free (smallSlots ops in
// flight); the rest, and every other op, pin as before.
const (
	smallBytes = 256
	smallSlots = 64
)

// smallSlab is the backend's C memory for small ops; b.mu guards it.
type smallSlab struct {
	mem  unsafe.Pointer // smallSlots slots of smallBytes, from malloc; nil once freed
	free []uint16       // free slots
}

func newSmallSlab() smallSlab {
	s := smallSlab{mem: C.malloc(smallSlots * smallBytes), free: make([]uint16, smallSlots)}
	for i := range s.free {
		s.free[i] = uint16(smallSlots - 1 - i)
	}
	return s
}

// slotAddr is the address of slot i.
func (s *smallSlab) slotAddr(i int) unsafe.Pointer {
	return unsafe.Add(s.mem, i*smallBytes)
}

// smallLocked gives w's one small in-place collective (plan.small) a slot
// and copies the tensor's bytes in; false when no slot is free or the
// slab is gone, and the caller pins the tensor instead. b.mu is held.
func (b *Backend) smallLocked(w *work) bool {
	s := &b.small
	if s.mem == nil || len(s.free) == 0 {
		return false
	}
	i := int(s.free[len(s.free)-1])
	s.free = s.free[:len(s.free)-1]
	a := s.slotAddr(i)
	copy(unsafe.Slice((*byte)(a), smallBytes), w.small)
	addr := C.uintptr_t(uintptr(a))
	w.descs[0].src, w.descs[0].dst = addr, addr
	w.slot = i + 1
	return true
}

// smallDoneLocked copies a small op's result back into its tensor (with
// back, unless the op failed, or was failed, before UCC finished it) and
// frees its slot. b.mu is held.
func (b *Backend) smallDoneLocked(w *work, back bool) {
	i := w.slot - 1
	if back && w.err == nil && !w.IsCompleted() {
		copy(w.small, unsafe.Slice((*byte)(b.small.slotAddr(i)), len(w.small)))
	}
	w.slot = 0
	b.small.free = append(b.small.free, uint16(i))
}

// freeSmallLocked releases the slab, once UCC holds no request (Close).
func (b *Backend) freeSmallLocked() {
	if b.small.mem != nil {
		C.free(b.small.mem)
		b.small.mem = nil
	}
}
