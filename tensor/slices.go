package tensor

// Host constructors and readers.
//
// Byte order: a tensor's bytes are its elements in little-endian order, the
// layout of device memory and of the wire on every platform gocoll supports
// (amd64, arm64). Scalar access (At, SetAt, Fill, Float64s, FromFloat64s)
// goes through encoding/binary.LittleEndian; the bulk copies of FromSlice
// and ToSlice reinterpret Go slices as bytes with unsafe, which is correct
// only on a little-endian host. TestHostLittleEndian guards the assumption.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"unsafe"
)

// ErrDType reports an element type that does not match the tensor's.
var ErrDType = errors.New("tensor: dtype mismatch")

// ErrNotHost reports a host-only operation on a tensor whose data is not in
// Go memory (a device tensor).
var ErrNotHost = errors.New("tensor: not a host tensor")

// Elem is the set of Go element types that have a DType of the same layout:
// float32, float64, int8, uint8, int32, int64 and bool (one byte, 0 or 1),
// or any type defined on one of them. Float16, BFloat16 and the float8 types
// have no Go type; use FromFloat64s and Float64s, or FromBytes.
type Elem interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64 | ~bool
}

// DTypeOf returns the DType whose elements have T's layout.
func DTypeOf[T Elem]() DType {
	switch reflect.TypeFor[T]().Kind() {
	case reflect.Float32:
		return Float32
	case reflect.Float64:
		return Float64
	case reflect.Int8:
		return Int8
	case reflect.Uint8:
		return Uint8
	case reflect.Int32:
		return Int32
	case reflect.Int64:
		return Int64
	default: // reflect.Bool: the constraint admits nothing else
		return Bool
	}
}

// asBytes views s's memory as bytes (native order; see the file comment).
func asBytes[T Elem](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// FromSlice returns a new host tensor holding a copy of data, with the dtype
// DTypeOf[T]. With no shape it is 1-D of len(data); otherwise the shape's
// element count must equal len(data).
func FromSlice[T Elem](data []T, shape ...int) (*Tensor, error) {
	dt := DTypeOf[T]()
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if n := numel(shape); n != len(data) {
		return nil, fmt.Errorf("%w: %d %s values for shape %v (want %d)", ErrShape, len(data), dt, shape, n)
	}
	t := New(dt, shape...)
	copy(t.host, asBytes(data))
	return t, nil
}

// ToSlice returns a copy of a contiguous host tensor's elements. T must be
// the Go type of t's dtype (see DTypeOf). Bool bytes other than 0 read as
// true.
func ToSlice[T Elem](t *Tensor) ([]T, error) {
	if dt := DTypeOf[T](); t.dtype != dt {
		return nil, fmt.Errorf("%w: ToSlice of %s as %s (Go %s)", ErrDType, t, dt, reflect.TypeFor[T]())
	}
	b, err := t.hostData("ToSlice")
	if err != nil {
		return nil, err
	}
	out := make([]T, t.Numel())
	ob := asBytes(out)
	if t.dtype == Bool {
		for i, x := range b {
			if x != 0 {
				ob[i] = 1 // a Go bool must be exactly 0 or 1
			}
		}
		return out, nil
	}
	copy(ob, b)
	return out, nil
}

// FromFloat64s returns a new host tensor of dtype dt holding data converted
// element by element, as a C cast would: floats round to nearest even (the
// narrow types with the conversions in this package, so Float8E4M3 turns
// out-of-range values into NaN); integers truncate toward zero, and values
// outside the type wrap modulo 2^bits (after clamping to the int64 range;
// NaN becomes 0), as PyTorch's CPU casts do; Bool is x != 0. With no shape
// the tensor is 1-D of len(data).
func FromFloat64s(dt DType, data []float64, shape ...int) (*Tensor, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: FromFloat64s to invalid %s", ErrDType, dt)
	}
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if n := numel(shape); n != len(data) {
		return nil, fmt.Errorf("%w: %d values for %s shape %v (want %d)", ErrShape, len(data), dt, shape, n)
	}
	t := New(dt, shape...)
	es := dt.Size()
	for i, v := range data {
		putFloat64(dt, t.host[i*es:], v)
	}
	return t, nil
}

// Float64s returns the elements of a contiguous host tensor of any dtype as
// float64s: exact for every type but Int64 beyond ±2^53, which rounds to
// nearest even; Bool is 0 or 1.
func (t *Tensor) Float64s() ([]float64, error) {
	b, err := t.hostData("Float64s")
	if err != nil {
		return nil, err
	}
	es := t.dtype.Size()
	out := make([]float64, t.Numel())
	for i := range out {
		out[i] = getFloat64(t.dtype, b[i*es:])
	}
	return out, nil
}

// At returns element i of the flattened tensor as Float64s would. It panics
// if t is not a contiguous host tensor or i is out of range.
func (t *Tensor) At(i int) float64 {
	b := t.mustHostData("At")
	if i < 0 || i >= t.Numel() {
		panic(fmt.Sprintf("tensor: At(%d) out of range for %s", i, t))
	}
	return getFloat64(t.dtype, b[i*t.dtype.Size():])
}

// SetAt stores v, converted as FromFloat64s converts, as element i of the
// flattened tensor. It panics if t is not a contiguous host tensor or i is
// out of range.
func (t *Tensor) SetAt(i int, v float64) {
	b := t.mustHostData("SetAt")
	if i < 0 || i >= t.Numel() {
		panic(fmt.Sprintf("tensor: SetAt(%d) out of range for %s", i, t))
	}
	putFloat64(t.dtype, b[i*t.dtype.Size():], v)
}

// Fill sets every element to v, converted as FromFloat64s converts. It
// panics if t is not a contiguous host tensor.
func (t *Tensor) Fill(v float64) {
	b := t.mustHostData("Fill")
	if len(b) == 0 {
		return
	}
	putFloat64(t.dtype, b, v)
	for n := t.dtype.Size(); n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

// Clone returns a deep copy of a host tensor: a new contiguous tensor with
// the same dtype, shape and elements (a strided view is gathered). It panics
// for a device tensor, whose memory only the owning package can copy.
func (t *Tensor) Clone() *Tensor {
	if !t.isHost() {
		panic(fmt.Sprintf("tensor: Clone of %s: not a host tensor", t))
	}
	c := New(t.dtype, t.shape...)
	if t.IsContiguous() {
		copy(c.host, t.Bytes())
	} else {
		t.gather(c.host)
	}
	return c
}

// Equal reports whether a and b are host tensors with the same dtype, shape
// and element bytes (strides may differ). The comparison is bitwise: a NaN
// equals the same NaN pattern, and 0 and -0 differ. Device tensors are equal
// to nothing but themselves; two nils are equal.
func Equal(a, b *Tensor) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil || a.dtype != b.dtype || !a.isHost() || !b.isHost() {
		return false
	}
	if len(a.shape) != len(b.shape) {
		return false
	}
	for i := range a.shape {
		if a.shape[i] != b.shape[i] {
			return false
		}
	}
	return bytes.Equal(a.logicalBytes(), b.logicalBytes())
}

// isHost reports whether t's elements are in Go memory.
func (t *Tensor) isHost() bool {
	return t.device.Type == CPU && (t.host != nil || t.Numel() == 0)
}

// hostData returns the bytes of a contiguous host tensor, or an error naming
// op.
func (t *Tensor) hostData(op string) ([]byte, error) {
	if !t.isHost() {
		return nil, fmt.Errorf("%w: %s of %s", ErrNotHost, op, t)
	}
	if !t.IsContiguous() {
		return nil, fmt.Errorf("%w: %s of non-contiguous %s (strides %v)", ErrShape, op, t, t.strides)
	}
	return t.Bytes(), nil
}

func (t *Tensor) mustHostData(op string) []byte {
	b, err := t.hostData(op)
	if err != nil {
		panic(err)
	}
	return b
}

// logicalBytes returns the elements of a host tensor in row-major order: its
// own bytes when contiguous, else a gathered copy.
func (t *Tensor) logicalBytes() []byte {
	if t.IsContiguous() {
		return t.Bytes()
	}
	out := make([]byte, t.NBytes())
	t.gather(out)
	return out
}

// gather copies the elements of a strided host view, in row-major order,
// into dst (len NBytes).
func (t *Tensor) gather(dst []byte) {
	n := t.Numel()
	if n == 0 {
		return
	}
	es := t.dtype.Size()
	idx := make([]int, len(t.shape))
	off := t.offset
	for k := range n {
		copy(dst[k*es:(k+1)*es], t.host[off*es:(off+1)*es])
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			off += t.strides[d]
			if idx[d] < t.shape[d] {
				break
			}
			off -= idx[d] * t.strides[d]
			idx[d] = 0
		}
	}
}

var le = binary.LittleEndian

// getFloat64 decodes the element of type dt at the start of b.
func getFloat64(dt DType, b []byte) float64 {
	switch dt {
	case Float32:
		return float64(math.Float32frombits(le.Uint32(b)))
	case Float64:
		return math.Float64frombits(le.Uint64(b))
	case Float16:
		return Float16ToFloat64(le.Uint16(b))
	case BFloat16:
		return BFloat16ToFloat64(le.Uint16(b))
	case Int8:
		return float64(int8(b[0]))
	case Uint8:
		return float64(b[0])
	case Int32:
		return float64(int32(le.Uint32(b)))
	case Int64:
		return float64(int64(le.Uint64(b)))
	case Bool:
		if b[0] != 0 {
			return 1
		}
		return 0
	case Float8E4M3:
		return Float8E4M3ToFloat64(b[0])
	case Float8E5M2:
		return Float8E5M2ToFloat64(b[0])
	}
	panic(fmt.Sprintf("tensor: invalid dtype %s", dt))
}

// putFloat64 encodes v as an element of type dt at the start of b.
func putFloat64(dt DType, b []byte, v float64) {
	switch dt {
	case Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	case Float64:
		le.PutUint64(b, math.Float64bits(v))
	case Float16:
		le.PutUint16(b, Float16FromFloat64(v))
	case BFloat16:
		le.PutUint16(b, BFloat16FromFloat64(v))
	case Int8, Uint8:
		b[0] = byte(truncInt64(v))
	case Int32:
		le.PutUint32(b, uint32(truncInt64(v)))
	case Int64:
		le.PutUint64(b, uint64(truncInt64(v)))
	case Bool:
		b[0] = 0
		if v != 0 {
			b[0] = 1
		}
	case Float8E4M3:
		b[0] = Float8E4M3FromFloat64(v)
	case Float8E5M2:
		b[0] = Float8E5M2FromFloat64(v)
	default:
		panic(fmt.Sprintf("tensor: invalid dtype %s", dt))
	}
}

// truncInt64 truncates v toward zero, clamping to the int64 range; NaN is 0.
// (Go leaves out-of-range float-to-int conversions implementation-defined.)
func truncInt64(v float64) int64 {
	switch {
	case v != v:
		return 0
	case v >= 0x1p63:
		return math.MaxInt64
	case v <= -0x1p63:
		return math.MinInt64
	}
	return int64(v)
}
