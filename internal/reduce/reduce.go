// Package reduce holds the element-wise reduction kernels that host
// collective algorithms apply to byte buffers: one Kernel per (dtype,
// reduce op), with the pre-scaling of PREMUL_SUM and the division of AVG.
//
// Narrow floating-point types (float16, bfloat16, the float8 types) are
// widened to float32, combined and rounded back once per combine, as Gloo
// does for at::Half. Bool combines as logic: SUM and MAX are OR, PRODUCT and
// MIN are AND.
//
// Buffers are tensor bytes: little-endian elements, aligned to the element
// size (tensor storage and scratch come from make, which aligns them), so
// the kernels view them as Go slices of the element type without copying.
package reduce

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// Kernel reduces buffers of one dtype with one reduce op.
type Kernel struct {
	// ElemSize is the element size in bytes; buffers passed to the kernel
	// hold whole elements.
	ElemSize int
	// Combine sets dst[i] = dst[i] op src[i]. It is commutative, so every
	// rank of a symmetric algorithm computes bit-identical results.
	Combine func(dst, src []byte)
	// Pre, when not nil, scales a rank's own contribution before it is
	// combined (PREMUL_SUM's factor).
	Pre func(buf []byte)
	// Post, when not nil, finishes a fully reduced buffer (AVG's division by
	// the number of ranks).
	Post func(buf []byte, ranks int)
}

// For returns the kernel of op on dt. It fails, wrapping
// reduceop.ErrInvalid, for an unknown op or a bitwise op on a
// floating-point type.
func For(dt tensor.DType, op reduceop.ReduceOp) (Kernel, error) {
	if err := op.ValidFor(dt); err != nil {
		return Kernel{}, err
	}
	k := Kernel{ElemSize: dt.Size()}
	base := op.Type
	switch op.Type {
	case reduceop.Avg, reduceop.PreMulSum:
		base = reduceop.Sum
	}
	switch dt {
	case tensor.Float32:
		k.Combine = arith[float32](base)
	case tensor.Float64:
		k.Combine = arith[float64](base)
	case tensor.Int8:
		k.Combine = integer[int8](base)
	case tensor.Uint8:
		k.Combine = integer[uint8](base)
	case tensor.Int32:
		k.Combine = integer[int32](base)
	case tensor.Int64:
		k.Combine = integer[int64](base)
	case tensor.Bool:
		k.Combine = logic(base)
	case tensor.Float16, tensor.BFloat16, tensor.Float8E4M3, tensor.Float8E5M2:
		k.Combine = narrow(dt, base)
	default:
		return Kernel{}, fmt.Errorf("%w: reduce: unsupported dtype %v", reduceop.ErrInvalid, dt)
	}
	if k.Combine == nil {
		return Kernel{}, fmt.Errorf("%w: reduce: %v is not defined for %v", reduceop.ErrInvalid, op, dt)
	}
	switch op.Type {
	case reduceop.PreMulSum:
		f := op.Factor
		k.Pre = func(buf []byte) { scale(dt, buf, f) }
	case reduceop.Avg:
		k.Post = func(buf []byte, ranks int) { divide(dt, buf, ranks) }
	}
	return k, nil
}

// view reinterprets b as a slice of T; see the package comment on alignment.
func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

type number interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64
}

type integral interface {
	~int8 | ~uint8 | ~int32 | ~int64
}

func sumBytesF32(d, s []byte) { sumFloat32(view[float32](d), view[float32](s)) }
func sumBytesF64(d, s []byte) { sumFloat64(view[float64](d), view[float64](s)) }

func arith[T number](t reduceop.Type) func(dst, src []byte) {
	switch t {
	case reduceop.Sum:
		var z T
		switch any(z).(type) {
		case float32:
			return sumBytesF32 // a plain function: For allocates nothing for it
		case float64:
			return sumBytesF64
		}
		return func(d, s []byte) { sum(view[T](d), view[T](s)) }
	case reduceop.Product:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] *= sv[i]
			}
		}
	case reduceop.Min:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] = min(dv[i], sv[i]) // Go's min propagates NaN, as torch does
			}
		}
	case reduceop.Max:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] = max(dv[i], sv[i])
			}
		}
	}
	return nil
}

// sum is the hot kernel of allreduce; unrolled by four because the Go
// compiler does not vectorise.
func sum[T number](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d4, s4 := d[i:i+4:i+4], s[i:i+4:i+4]
		d4[0] += s4[0]
		d4[1] += s4[1]
		d4[2] += s4[2]
		d4[3] += s4[3]
	}
	for ; i < len(d); i++ {
		d[i] += s[i]
	}
}

func integer[T integral](t reduceop.Type) func(dst, src []byte) {
	switch t {
	case reduceop.BAnd:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] &= sv[i]
			}
		}
	case reduceop.BOr:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] |= sv[i]
			}
		}
	case reduceop.BXor:
		return func(d, s []byte) {
			dv, sv := view[T](d), view[T](s)
			sv = sv[:len(dv)]
			for i := range dv {
				dv[i] ^= sv[i]
			}
		}
	}
	return arith[T](t)
}

// logic combines bools stored as bytes 0/1. Inputs may hold other non-zero
// bytes (ToSlice reads them as true); outputs are always 0 or 1.
func logic(t reduceop.Type) func(dst, src []byte) {
	var f func(a, b bool) bool
	switch t {
	case reduceop.Sum, reduceop.Max, reduceop.BOr:
		f = func(a, b bool) bool { return a || b }
	case reduceop.Product, reduceop.Min, reduceop.BAnd:
		f = func(a, b bool) bool { return a && b }
	case reduceop.BXor:
		f = func(a, b bool) bool { return a != b }
	default:
		return nil
	}
	return func(d, s []byte) {
		s = s[:len(d)]
		for i := range d {
			if f(d[i] != 0, s[i] != 0) {
				d[i] = 1
			} else {
				d[i] = 0
			}
		}
	}
}

// codec widens and rounds one narrow float type.
type codec struct {
	size  int
	load  func(b []byte) float32
	store func(b []byte, v float32)
}

func codecOf(dt tensor.DType) codec {
	switch dt {
	case tensor.Float16:
		return codec{2,
			func(b []byte) float32 { return tensor.Float16ToFloat32(uint16(b[0]) | uint16(b[1])<<8) },
			func(b []byte, v float32) { h := tensor.Float16FromFloat32(v); b[0], b[1] = byte(h), byte(h>>8) }}
	case tensor.BFloat16:
		return codec{2,
			func(b []byte) float32 { return tensor.BFloat16ToFloat32(uint16(b[0]) | uint16(b[1])<<8) },
			func(b []byte, v float32) { h := tensor.BFloat16FromFloat32(v); b[0], b[1] = byte(h), byte(h>>8) }}
	case tensor.Float8E4M3:
		return codec{1,
			func(b []byte) float32 { return tensor.Float8E4M3ToFloat32(b[0]) },
			func(b []byte, v float32) { b[0] = tensor.Float8E4M3FromFloat32(v) }}
	default: // Float8E5M2
		return codec{1,
			func(b []byte) float32 { return tensor.Float8E5M2ToFloat32(b[0]) },
			func(b []byte, v float32) { b[0] = tensor.Float8E5M2FromFloat32(v) }}
	}
}

func narrow(dt tensor.DType, t reduceop.Type) func(dst, src []byte) {
	var f func(a, b float32) float32
	switch t {
	case reduceop.Sum:
		f = func(a, b float32) float32 { return a + b }
	case reduceop.Product:
		f = func(a, b float32) float32 { return a * b }
	case reduceop.Min:
		f = func(a, b float32) float32 { return min(a, b) }
	case reduceop.Max:
		f = func(a, b float32) float32 { return max(a, b) }
	default:
		return nil
	}
	c := codecOf(dt)
	return func(d, s []byte) {
		for i := 0; i+c.size <= len(d); i += c.size {
			c.store(d[i:], f(c.load(d[i:]), c.load(s[i:])))
		}
	}
}

// scale multiplies every element by f, rounding to the dtype as a cast
// would (integers truncate toward zero; bool is x*f != 0).
func scale(dt tensor.DType, buf []byte, f float64) {
	switch dt {
	case tensor.Float32:
		v := view[float32](buf)
		for i := range v {
			v[i] = float32(float64(v[i]) * f)
		}
	case tensor.Float64:
		v := view[float64](buf)
		for i := range v {
			v[i] *= f
		}
	case tensor.Int8:
		scaleInt(view[int8](buf), f)
	case tensor.Uint8:
		scaleInt(view[uint8](buf), f)
	case tensor.Int32:
		scaleInt(view[int32](buf), f)
	case tensor.Int64:
		scaleInt(view[int64](buf), f)
	case tensor.Bool:
		for i := range buf {
			if buf[i] != 0 && f != 0 {
				buf[i] = 1
			} else {
				buf[i] = 0
			}
		}
	default:
		c := codecOf(dt)
		for i := 0; i+c.size <= len(buf); i += c.size {
			c.store(buf[i:], float32(float64(c.load(buf[i:]))*f))
		}
	}
}

func scaleInt[T integral](v []T, f float64) {
	for i := range v {
		x := float64(v[i]) * f
		if math.IsNaN(x) {
			x = 0
		}
		v[i] = T(int64(math.Max(math.Min(x, math.MaxInt64), math.MinInt64)))
	}
}

// divide finishes AVG: floats divide (narrow types round once); integers
// divide truncating toward zero; bool stays the OR of the inputs (the mean
// of bools is non-zero exactly when one of them is true).
func divide(dt tensor.DType, buf []byte, n int) {
	switch dt {
	case tensor.Float32:
		v := view[float32](buf)
		d := float32(n)
		for i := range v {
			v[i] /= d
		}
	case tensor.Float64:
		v := view[float64](buf)
		d := float64(n)
		for i := range v {
			v[i] /= d
		}
	case tensor.Int8:
		divInt(view[int8](buf), n)
	case tensor.Uint8:
		divInt(view[uint8](buf), n)
	case tensor.Int32:
		divInt(view[int32](buf), n)
	case tensor.Int64:
		divInt(view[int64](buf), n)
	case tensor.Bool:
	default:
		c := codecOf(dt)
		d := float32(n)
		for i := 0; i+c.size <= len(buf); i += c.size {
			c.store(buf[i:], c.load(buf[i:])/d)
		}
	}
}

func divInt[T integral](v []T, n int) {
	for i := range v {
		v[i] = T(int64(v[i]) / int64(n)) // in int64: n may not fit T
	}
}
