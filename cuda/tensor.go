package cuda

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/gocoll/gocoll/tensor"
)

// Empty returns an uninitialised CUDA tensor on device dev, allocated in
// stream order on ctx's current stream.
func Empty(ctx context.Context, dev int, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	d, err := GetDevice(dev)
	if err != nil {
		return nil, err
	}
	n := dt.Size()
	for _, s := range shape {
		n *= s
	}
	b, err := d.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	t, err := tensor.FromDevice(tensor.CUDADevice(dev), dt, b, shape...)
	if err != nil {
		b.Free()
		return nil, err
	}
	return t, nil
}

// Zeros is Empty followed by a stream-ordered memset to zero.
func Zeros(ctx context.Context, dev int, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	t, err := Empty(ctx, dev, dt, shape...)
	if err != nil {
		return nil, err
	}
	d, _ := GetDevice(dev)
	if err := StreamFor(ctx, d).Memset8(t.Ptr(), 0, t.NBytes()); err != nil {
		t.Free()
		return nil, err
	}
	return t, nil
}

// FromHost copies a contiguous host tensor to a new tensor on device dev,
// in stream order on ctx's current stream. The driver stages the pageable
// source before returning, so h may be reused at once.
func FromHost(ctx context.Context, dev int, h *tensor.Tensor) (*tensor.Tensor, error) {
	if h.Device().Type != tensor.CPU || !h.IsContiguous() {
		return nil, fmt.Errorf("cuda: FromHost needs a contiguous host tensor, got %v", h)
	}
	t, err := Empty(ctx, dev, h.DType(), h.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := CopyFromHost(ctx, t, h); err != nil {
		t.Free()
		return nil, err
	}
	return t, nil
}

// CopyFromHost copies host tensor h into device tensor t (same byte size)
// on ctx's current stream.
func CopyFromHost(ctx context.Context, t, h *tensor.Tensor) error {
	if t.NBytes() != h.NBytes() {
		return fmt.Errorf("cuda: copy of %d bytes into %d", h.NBytes(), t.NBytes())
	}
	s, err := streamOf(ctx, t)
	if err != nil {
		return err
	}
	return s.CopyHtoD(t.Ptr(), h.HostPtr(), h.NBytes())
}

// ToHost copies device tensor t into a new host tensor, in stream order on
// ctx's current stream, and returns once the copy is done (so it waits for
// the work queued before it on that stream).
func ToHost(ctx context.Context, t *tensor.Tensor) (*tensor.Tensor, error) {
	s, err := streamOf(ctx, t)
	if err != nil {
		return nil, err
	}
	h := tensor.New(t.DType(), t.Shape()...)
	if h.NBytes() == 0 {
		return h, nil
	}
	if err := s.CopyDtoH(h.HostPtr(), t.Ptr(), t.NBytes()); err != nil {
		return nil, err
	}
	// A pageable destination makes the copy synchronous already; the stream
	// sync makes that explicit and covers drivers that stage differently.
	return h, s.Synchronize()
}

// CopyToPinned queues a copy of device tensor t into pinned memory dst on
// ctx's current stream, without blocking (usable while gates are closed).
func CopyToPinned(ctx context.Context, dst *HostBuffer, t *tensor.Tensor) error {
	if dst.Len() < t.NBytes() {
		return fmt.Errorf("cuda: %d pinned bytes for a %d-byte tensor", dst.Len(), t.NBytes())
	}
	s, err := streamOf(ctx, t)
	if err != nil {
		return err
	}
	return s.CopyDtoH(unsafe.Pointer(dst.Pointer()), t.Ptr(), t.NBytes())
}

// BufferOf returns the *Buffer under a CUDA tensor made by this package, or
// nil.
func BufferOf(t *tensor.Tensor) *Buffer {
	b, _ := t.Memory().(*Buffer)
	return b
}

// streamOf returns ctx's current stream for t's device.
func streamOf(ctx context.Context, t *tensor.Tensor) (*Stream, error) {
	if t.Device().Type != tensor.CUDA {
		return nil, fmt.Errorf("cuda: %v is not a CUDA tensor", t)
	}
	d, err := GetDevice(t.Device().Index)
	if err != nil {
		return nil, err
	}
	return StreamFor(ctx, d), nil
}

var _ tensor.DeviceMemory = (*Buffer)(nil)
