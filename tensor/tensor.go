// Package tensor holds the values that collectives move: a typed, shaped,
// contiguous buffer on a device.
//
// Host tensors own a Go byte slice and are made from, and read back into, Go
// slices. Device tensors wrap memory that another package (cuda) allocated;
// they carry the device pointer and an owner that frees it. This package
// never calls into a native library, so it builds everywhere.
package tensor

import (
	"errors"
	"fmt"
	"unsafe"
)

// DeviceType is the kind of memory a tensor lives in.
type DeviceType uint8

const (
	// CPU is host memory.
	CPU DeviceType = iota
	// CUDA is NVIDIA GPU memory.
	CUDA
)

// String returns the PyTorch spelling: "cpu" or "cuda".
func (d DeviceType) String() string {
	switch d {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("DeviceType(%d)", uint8(d))
}

// ParseDeviceType reads "cpu" or "cuda".
func ParseDeviceType(s string) (DeviceType, error) {
	switch s {
	case "cpu":
		return CPU, nil
	case "cuda":
		return CUDA, nil
	}
	return 0, fmt.Errorf("tensor: unknown device type %q (want cpu or cuda)", s)
}

// Device names one device: a type and, for CUDA, an ordinal.
type Device struct {
	Type  DeviceType
	Index int
}

// Host is the CPU device.
var Host = Device{Type: CPU}

// CUDADevice returns the CUDA device with ordinal i.
func CUDADevice(i int) Device { return Device{Type: CUDA, Index: i} }

// String returns "cpu" or "cuda:N".
func (d Device) String() string {
	if d.Type == CPU {
		return "cpu"
	}
	return fmt.Sprintf("%s:%d", d.Type, d.Index)
}

// DeviceMemory is device memory owned by another package. The tensor keeps
// it alive; Free hands it back (for CUDA: a stream-ordered free).
type DeviceMemory interface {
	// Ptr is the device address of the first byte.
	Ptr() uintptr
	// Len is the size in bytes.
	Len() int
	// Free releases the memory. It is called at most once.
	Free() error
}

// ErrShape reports a shape, size or layout that does not fit the data.
var ErrShape = errors.New("tensor: bad shape")

// Tensor is a dense buffer plus its shape and strides (in elements).
//
// A Tensor made by this package is contiguous. AsStrided exists so that
// callers can build the non-contiguous views that collectives must refuse.
type Tensor struct {
	dtype   DType
	device  Device
	shape   []int
	strides []int
	offset  int // in elements
	host    []byte
	mem     DeviceMemory
}

// New returns a zeroed host tensor. It panics on a negative dimension.
func New(dt DType, shape ...int) *Tensor {
	if err := checkShape(shape); err != nil {
		panic(err)
	}
	n := numel(shape)
	return &Tensor{dtype: dt, device: Host, shape: clone(shape), strides: contiguousStrides(shape), host: make([]byte, n*dt.Size())}
}

// FromBytes wraps b (not copied) as a host tensor. len(b) must equal the
// shape's element count times the dtype's size.
func FromBytes(dt DType, b []byte, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if b == nil {
		b = []byte{} // a nil host slice would read as a device tensor
	}
	if want := numel(shape) * dt.Size(); len(b) != want {
		return nil, fmt.Errorf("%w: %d bytes for %v %s (want %d)", ErrShape, len(b), shape, dt, want)
	}
	return &Tensor{dtype: dt, device: Host, shape: clone(shape), strides: contiguousStrides(shape), host: b}, nil
}

// FromDevice wraps device memory as a tensor on dev. mem.Len() must equal
// the shape's element count times the dtype's size.
func FromDevice(dev Device, dt DType, mem DeviceMemory, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if want := numel(shape) * dt.Size(); mem.Len() != want {
		return nil, fmt.Errorf("%w: %d device bytes for %v %s (want %d)", ErrShape, mem.Len(), shape, dt, want)
	}
	return &Tensor{dtype: dt, device: dev, shape: clone(shape), strides: contiguousStrides(shape), mem: mem}, nil
}

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Device returns where the data lives.
func (t *Tensor) Device() Device { return t.device }

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return clone(t.shape) }

// AppendShape appends the shape to dst and returns it; unlike Shape it
// allocates nothing when dst has room, for recorders on the hot path.
func (t *Tensor) AppendShape(dst []int) []int { return append(dst, t.shape...) }

// Strides returns a copy of the strides, in elements.
func (t *Tensor) Strides() []int { return clone(t.strides) }

// Dim returns the number of dimensions.
func (t *Tensor) Dim() int { return len(t.shape) }

// Numel returns the number of elements.
func (t *Tensor) Numel() int { return numel(t.shape) }

// NBytes returns Numel times the element size.
func (t *Tensor) NBytes() int { return t.Numel() * t.dtype.Size() }

// IsContiguous reports whether the elements are dense in row-major order.
func (t *Tensor) IsContiguous() bool {
	want := 1
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != want {
			return false
		}
		want *= t.shape[i]
	}
	return true
}

// Bytes returns the host bytes of a contiguous host tensor (not a copy), or
// nil for a device tensor.
func (t *Tensor) Bytes() []byte {
	if t.host == nil {
		return nil
	}
	es := t.dtype.Size()
	return t.host[t.offset*es : (t.offset+t.Numel())*es]
}

// Memory returns the device memory of a device tensor, or nil.
func (t *Tensor) Memory() DeviceMemory { return t.mem }

// Ptr returns the device address of the first element, or 0 for a host
// tensor.
func (t *Tensor) Ptr() uintptr {
	if t.mem == nil {
		return 0
	}
	return t.mem.Ptr() + uintptr(t.offset*t.dtype.Size())
}

// HostPtr returns the address of the first host byte, or nil when the tensor
// is empty or on a device. It is for handing buffers to C.
func (t *Tensor) HostPtr() unsafe.Pointer {
	b := t.Bytes()
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Free releases device memory. It is a no-op for host tensors.
func (t *Tensor) Free() error {
	if t.mem == nil {
		return nil
	}
	m := t.mem
	t.mem = nil
	return m.Free()
}

// Reshape returns a view with a new shape and the same element count.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	if !t.IsContiguous() {
		return nil, fmt.Errorf("%w: reshape of a non-contiguous tensor", ErrShape)
	}
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if numel(shape) != t.Numel() {
		return nil, fmt.Errorf("%w: cannot reshape %v into %v", ErrShape, t.shape, shape)
	}
	v := *t
	v.shape, v.strides = clone(shape), contiguousStrides(shape)
	return &v, nil
}

// Narrow returns the view of elements [start, start+n) of the flattened,
// contiguous tensor, as a 1-D tensor sharing storage.
func (t *Tensor) Narrow(start, n int) (*Tensor, error) {
	if !t.IsContiguous() || start < 0 || n < 0 || start+n > t.Numel() {
		return nil, fmt.Errorf("%w: narrow [%d,%d) of %v", ErrShape, start, start+n, t.shape)
	}
	v := *t
	v.offset += start
	v.shape, v.strides = []int{n}, []int{1}
	return &v, nil
}

// AsStrided returns a view with explicit shape and strides over the same
// storage. It exists to build non-contiguous inputs; collectives reject them.
func (t *Tensor) AsStrided(shape, strides []int) (*Tensor, error) {
	if len(shape) != len(strides) {
		return nil, fmt.Errorf("%w: %d dims but %d strides", ErrShape, len(shape), len(strides))
	}
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	first, last := 0, 0 // lowest and highest element offsets, relative
	for i := range shape {
		if shape[i] > 0 {
			if d := (shape[i] - 1) * strides[i]; d < 0 {
				first += d
			} else {
				last += d
			}
		}
	}
	if numel(shape) > 0 && (t.offset+first < 0 || t.offset+last >= t.storageElems()) {
		return nil, fmt.Errorf("%w: view %v/%v past the end of storage", ErrShape, shape, strides)
	}
	v := *t
	v.shape, v.strides = clone(shape), clone(strides)
	return &v, nil
}

func (t *Tensor) storageElems() int {
	if t.host != nil {
		return len(t.host) / t.dtype.Size()
	}
	if t.mem != nil {
		return t.mem.Len() / t.dtype.Size()
	}
	return 0
}

// String describes the tensor as "float32[2 3] cpu".
func (t *Tensor) String() string {
	return fmt.Sprintf("%s%v %s", t.dtype, t.shape, t.device)
}

// checkShape rejects negative dimensions.
func checkShape(shape []int) error {
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("%w: negative dimension in %v", ErrShape, shape)
		}
	}
	return nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func contiguousStrides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

func clone(s []int) []int { return append([]int(nil), s...) }
