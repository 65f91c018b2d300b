package cuda

/*
#include "dl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Buffer is stream-ordered device memory (cuMemAllocAsync). It implements
// tensor.DeviceMemory.
//
// A Buffer is reference counted so that a pending Work can keep it alive:
// the owner's reference is dropped by Free, a stash takes one with Retain
// and drops it with Release, and the memory goes back to the pool
// (cuMemFreeAsync on the stream it was allocated on) when the last one is
// dropped. This is PyTorch's caching-allocator hazard and protection: the
// block returns to its allocation stream, which may reuse it at once.
//
// The last reference may go after the allocation stream was destroyed (a
// stash outliving the caller's stream): the Buffer holds a reference on
// the stream's driver handle (streamLife), so the free is still queued on
// a live stream, ordered after everything queued there.
type Buffer struct {
	ptr    uintptr
	n      int
	ctx    uintptr
	device int
	stream uintptr     // allocation stream, where the free is ordered
	life   *streamLife // keeps stream's handle valid until the free; nil for the default stream
	refs   atomic.Int32
	owner  atomic.Bool // the owner's reference is still held
}

// Alloc returns n bytes of device memory on d, allocated in stream order on
// ctx's current stream for d. The memory is usable by work queued on that
// stream after this call; other streams must wait on it first.
func (d *Device) Alloc(ctx context.Context, n int) (*Buffer, error) {
	return d.AllocOn(StreamFor(ctx, d), n)
}

// AllocOn is Alloc on an explicit stream.
func (d *Device) AllocOn(s *Stream, n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("cuda: negative allocation size %d", n)
	}
	b := &Buffer{n: n, ctx: d.ctx, device: d.ordinal, stream: s.Handle()}
	b.refs.Store(1)
	b.owner.Store(true)
	if n == 0 {
		return b, nil
	}
	var p C.CUdeviceptr
	if err := check("cuMemAllocAsync", C.gc_mem_alloc_async(C.uintptr_t(d.ctx), &p, C.size_t(n), C.uintptr_t(s.Handle()))); err != nil {
		return nil, err
	}
	b.ptr = uintptr(p)
	if s != nil {
		b.life = s.life
		b.life.retain()
	}
	return b, nil
}

// Ptr returns the device address.
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Len returns the size in bytes.
func (b *Buffer) Len() int { return b.n }

// Device returns the device ordinal.
func (b *Buffer) Device() int { return b.device }

// Free drops the owner's reference. The memory is freed (stream-ordered)
// now, or when the last Retain is released. A second Free is an error.
func (b *Buffer) Free() error {
	if !b.owner.CompareAndSwap(true, false) {
		return errors.New("cuda: buffer freed twice")
	}
	return b.Release()
}

// Retain takes a reference that keeps the memory from being freed.
func (b *Buffer) Retain() { b.refs.Add(1) }

// Release drops a reference taken by Retain (or the owner's, through Free).
func (b *Buffer) Release() error {
	switch r := b.refs.Add(-1); {
	case r > 0:
		return nil
	case r < 0:
		return errors.New("cuda: buffer released more often than retained")
	}
	if b.ptr == 0 {
		return nil
	}
	p, l := b.ptr, b.life
	b.ptr, b.life = 0, nil
	err := check("cuMemFreeAsync", C.gc_mem_free_async(C.uintptr_t(b.ctx), C.CUdeviceptr(p), C.uintptr_t(b.stream)))
	return errors.Join(err, l.release())
}

// FreedInOrderOn reports whether b's free is queued on stream s (its
// allocation stream, a stream of its own): work queued on s before the
// last reference goes is then ordered before the free, and before any
// reuse of the memory (the pool hands a block freed on s to s at once,
// and to another stream only after the free, by the pool's reuse rules),
// so it needs no reference to keep the memory alive. False for the
// default stream, which the non-blocking streams do not order with.
func (b *Buffer) FreedInOrderOn(s *Stream) bool {
	return b.stream != 0 && b.stream == s.Handle()
}

// Retainer is implemented by device memory that a pending op can keep
// alive: *Buffer. Backends stash tensors through it.
type Retainer interface {
	Retain()
	Release() error
}

// Host allocation flags (CU_MEMHOSTALLOC_*).
const (
	HostPortable      = 0x1
	HostDeviceMap     = 0x2
	HostWriteCombined = 0x4
)

// HostBuffer is pinned (page-locked) host memory. With HostDeviceMap it is
// also mapped into the device address space (DevicePtr).
type HostBuffer struct {
	p    unsafe.Pointer
	n    int
	ctx  uintptr
	dptr uintptr
}

// HostAlloc returns n bytes of pinned host memory, registered with d's
// context. flags are HostPortable, HostDeviceMap, HostWriteCombined.
func (d *Device) HostAlloc(n int, flags int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: pinned allocation of %d bytes", n)
	}
	var p unsafe.Pointer
	if err := check("cuMemHostAlloc", C.gc_host_alloc(C.uintptr_t(d.ctx), &p, C.size_t(n), C.unsigned(flags))); err != nil {
		return nil, err
	}
	h := &HostBuffer{p: p, n: n, ctx: d.ctx}
	if flags&HostDeviceMap != 0 {
		var dp C.CUdeviceptr
		if err := check("cuMemHostGetDevicePointer", C.gc_host_device_ptr(C.uintptr_t(d.ctx), &dp, p)); err != nil {
			C.gc_host_free(C.uintptr_t(d.ctx), p)
			return nil, err
		}
		h.dptr = uintptr(dp)
	}
	return h, nil
}

// Bytes returns the memory as a slice (valid until Free).
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// Pointer returns the host address.
func (h *HostBuffer) Pointer() unsafe.Pointer { return h.p }

// DevicePtr returns the device address of mapped memory, or 0.
func (h *HostBuffer) DevicePtr() uintptr { return h.dptr }

// Len returns the size in bytes.
func (h *HostBuffer) Len() int { return h.n }

// Free releases the pinned memory. cuMemFreeHost may synchronise the
// device, so never call it while a stream gate is closed.
func (h *HostBuffer) Free() error {
	if h.p == nil {
		return nil
	}
	p := h.p
	h.p = nil
	return check("cuMemFreeHost", C.gc_host_free(C.uintptr_t(h.ctx), p))
}

// CopyHtoD queues a copy of n bytes from host address src to device address
// dst on s. src must stay valid until the copy has run: use pinned memory
// (HostBuffer) for a truly asynchronous copy; with pageable memory the
// driver stages it before returning.
func (s *Stream) CopyHtoD(dst uintptr, src unsafe.Pointer, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync", C.gc_memcpy_htod_async(C.uintptr_t(s.ctx), C.CUdeviceptr(dst), src, C.size_t(n), C.uintptr_t(s.handle)))
}

// CopyDtoH queues a copy of n bytes from device address src to host address
// dst on s. Into pageable memory it returns only once the copy is done.
func (s *Stream) CopyDtoH(dst unsafe.Pointer, src uintptr, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemcpyDtoHAsync", C.gc_memcpy_dtoh_async(C.uintptr_t(s.ctx), dst, C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s.handle)))
}

// CopyDtoD queues a device-to-device copy of n bytes on s.
func (s *Stream) CopyDtoD(dst, src uintptr, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemcpyDtoDAsync", C.gc_memcpy_dtod_async(C.uintptr_t(s.ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s.handle)))
}

// Memset8 queues setting n bytes at p to v on s.
func (s *Stream) Memset8(p uintptr, v byte, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemsetD8Async", C.gc_memset_d8_async(C.uintptr_t(s.ctx), C.CUdeviceptr(p), C.uchar(v), C.size_t(n), C.uintptr_t(s.handle)))
}

// Memset32 queues setting n 32-bit words at p (4-byte aligned) to v on s.
func (s *Stream) Memset32(p uintptr, v uint32, n int) error {
	if n == 0 {
		return nil
	}
	return check("cuMemsetD32Async", C.gc_memset_d32_async(C.uintptr_t(s.ctx), C.CUdeviceptr(p), C.uint(v), C.size_t(n), C.uintptr_t(s.handle)))
}

// PointerDevice returns the ordinal of the device that owns device address p.
func PointerDevice(p uintptr) (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var o C.int
	if err := check("cuPointerGetAttribute", C.gc_pointer_device(0, &o, C.CUdeviceptr(p))); err != nil {
		return 0, err
	}
	return int(o), nil
}
