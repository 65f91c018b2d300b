package tensor

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"
)

// The unsafe bulk copies in FromSlice/ToSlice assume a little-endian host.
func TestHostLittleEndian(t *testing.T) {
	x := uint16(0x0102)
	if b := (*[2]byte)(unsafe.Pointer(&x)); b[0] != 0x02 {
		t.Fatal("big-endian host: FromSlice/ToSlice would store elements in the wrong byte order")
	}
}

func roundTrip[T Elem](t *testing.T, want DType, data []T) {
	t.Helper()
	x, err := FromSlice(data)
	if err != nil {
		t.Fatal(err)
	}
	if x.DType() != want || x.Dim() != 1 || x.Numel() != len(data) {
		t.Fatalf("FromSlice(%v) = %s, want %s[%d]", data, x, want, len(data))
	}
	if DTypeOf[T]() != want {
		t.Fatalf("DTypeOf = %s, want %s", DTypeOf[T](), want)
	}
	got, err := ToSlice[T](x)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(data) {
		t.Fatalf("ToSlice len %d, want %d", len(got), len(data))
	}
	for i := range data {
		if got[i] != data[i] {
			t.Fatalf("ToSlice[%d] = %v, want %v", i, got[i], data[i])
		}
	}
	// A copy, both ways.
	if len(data) > 0 {
		x.Bytes()[0] ^= 1
		if data[0] != got[0] {
			t.Fatal("FromSlice or ToSlice shares memory")
		}
	}
}

type myFloat float32

func TestFromSliceToSlice(t *testing.T) {
	roundTrip(t, Float32, []float32{1, -2.5, float32(math.Inf(1))})
	roundTrip(t, Float64, []float64{1, math.Pi, -0})
	roundTrip(t, Int8, []int8{-128, 0, 127})
	roundTrip(t, Uint8, []uint8{0, 255})
	roundTrip(t, Int32, []int32{math.MinInt32, 7})
	roundTrip(t, Int64, []int64{math.MinInt64, math.MaxInt64})
	roundTrip(t, Bool, []bool{true, false, true})
	roundTrip(t, Float32, []myFloat{3, 4})
	roundTrip(t, Float32, []float32{})

	x, err := FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s := x.Shape(); len(s) != 2 || s[0] != 2 || s[1] != 3 {
		t.Fatalf("shape %v", s)
	}
	if !bytes.Equal(x.Bytes()[:4], []byte{0, 0, 0x80, 0x3f}) { // 1.0f, little-endian
		t.Fatalf("bytes % x", x.Bytes()[:4])
	}
}

func TestFromSliceErrors(t *testing.T) {
	_, err := FromSlice([]float32{1, 2, 3, 4, 5}, 2, 3)
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "5") || !strings.Contains(err.Error(), "want 6") {
		t.Fatalf("mismatch error: %v", err)
	}
	if _, err := FromSlice([]int32{1}, -1, -1); !errors.Is(err, ErrShape) {
		t.Fatalf("negative dims: %v", err)
	}
	if _, err := FromFloat64s(Int8, []float64{1, 2}, 3); !errors.Is(err, ErrShape) {
		t.Fatalf("FromFloat64s mismatch: %v", err)
	}
	if _, err := FromFloat64s(DType(200), []float64{1}); !errors.Is(err, ErrDType) {
		t.Fatalf("FromFloat64s invalid dtype: %v", err)
	}
}

type fakeMem struct{ n int }

func (m fakeMem) Ptr() uintptr { return 0x1000 }
func (m fakeMem) Len() int     { return m.n }
func (m fakeMem) Free() error  { return nil }

func TestToSliceErrors(t *testing.T) {
	x, _ := FromSlice([]float32{1, 2, 3, 4}, 2, 2)
	if _, err := ToSlice[float64](x); !errors.Is(err, ErrDType) || !strings.Contains(err.Error(), "float64") {
		t.Fatalf("dtype mismatch: %v", err)
	}
	tr, err := x.AsStrided([]int{2, 2}, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ToSlice[float32](tr); !errors.Is(err, ErrShape) {
		t.Fatalf("non-contiguous: %v", err)
	}
	if _, err := tr.Float64s(); !errors.Is(err, ErrShape) {
		t.Fatalf("non-contiguous Float64s: %v", err)
	}
	d, err := FromDevice(CUDADevice(0), Float32, fakeMem{16}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ToSlice[float32](d); !errors.Is(err, ErrNotHost) {
		t.Fatalf("device: %v", err)
	}
	if _, err := d.Float64s(); !errors.Is(err, ErrNotHost) {
		t.Fatalf("device Float64s: %v", err)
	}
	// Host-typed device memory (e.g. pinned) is still not Go memory.
	p, _ := FromDevice(Host, Float32, fakeMem{16}, 4)
	if _, err := ToSlice[float32](p); !errors.Is(err, ErrNotHost) {
		t.Fatalf("pinned: %v", err)
	}
	mustPanic(t, "Clone device", func() { d.Clone() })
	mustPanic(t, "At device", func() { d.At(0) })
	if Equal(d, p) || !Equal(d, d) {
		t.Fatal("Equal on device tensors")
	}
}

func TestToSliceBoolNormalises(t *testing.T) {
	x, err := FromBytes(Bool, []byte{0, 1, 2, 255}, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ToSlice[bool](x)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true, true, true} {
		if got[i] != want || *(*byte)(unsafe.Pointer(&got[i])) > 1 {
			t.Fatalf("bool %d: %v", i, got[i])
		}
	}
}

func TestFromFloat64s(t *testing.T) {
	in := []float64{0, 1.9, -2.7, 300, -1, math.NaN(), 1e30, math.Copysign(0, -1)}
	cases := []struct {
		dt   DType
		want []float64 // as read back by Float64s; NaN compared by IsNaN
	}{
		{Int8, []float64{0, 1, -2, 44, -1, 0, -1, 0}},
		{Uint8, []float64{0, 1, 254, 44, 255, 0, 255, 0}},
		{Int32, []float64{0, 1, -2, 300, -1, 0, -1, 0}},
		{Int64, []float64{0, 1, -2, 300, -1, 0, math.MaxInt64, 0}},
		{Bool, []float64{0, 1, 1, 1, 1, 1, 1, 0}},
		{Float32, []float64{0, float64(float32(1.9)), float64(float32(-2.7)), 300, -1, math.NaN(), float64(float32(1e30)), 0}},
		{Float64, in},
		{Float16, []float64{0, Float16ToFloat64(Float16FromFloat64(1.9)), -2.69921875, 300, -1, math.NaN(), math.Inf(1), 0}},
		{BFloat16, []float64{0, 1.8984375, -2.703125, 300, -1, math.NaN(), BFloat16ToFloat64(BFloat16FromFloat64(1e30)), 0}},
		{Float8E4M3, []float64{0, 1.875, -2.75, 288, -1, math.NaN(), math.NaN(), 0}},
		{Float8E5M2, []float64{0, 2, -2.5, 320, -1, math.NaN(), math.Inf(1), 0}},
	}
	for _, c := range cases {
		x, err := FromFloat64s(c.dt, in)
		if err != nil {
			t.Fatal(err)
		}
		if x.DType() != c.dt || x.Numel() != len(in) || x.NBytes() != len(in)*c.dt.Size() {
			t.Fatalf("%s: got %s", c.dt, x)
		}
		got, err := x.Float64s()
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			w := c.want[i]
			if math.IsNaN(w) != math.IsNaN(got[i]) || !math.IsNaN(w) && w != got[i] {
				t.Errorf("%s from %v: got %v, want %v", c.dt, in[i], got[i], w)
			}
			if a := x.At(i); math.Float64bits(a) != math.Float64bits(got[i]) {
				t.Errorf("%s At(%d) = %v, Float64s %v", c.dt, i, a, got[i])
			}
		}
		// -0 survives in the float types.
		if c.dt.IsFloat() && !math.Signbit(got[7]) {
			t.Errorf("%s: -0 lost its sign", c.dt)
		}
	}
	// The float8 conversions of FromFloat64s are the exported ones.
	x, _ := FromFloat64s(Float8E4M3, []float64{448, 464, 465}, 3)
	if !bytes.Equal(x.Bytes(), []byte{0x7e, 0x7e, 0x7f}) {
		t.Fatalf("e4m3 bytes % x", x.Bytes())
	}
	// Int64 extremes.
	y, _ := FromFloat64s(Int64, []float64{-0x1p63, 0x1p63, -9.9e18}, 3)
	if v, _ := ToSlice[int64](y); v[0] != math.MinInt64 || v[1] != math.MaxInt64 || v[2] != math.MinInt64 {
		t.Fatalf("int64 clamp: %v", v)
	}
}

func TestAtSetAtFill(t *testing.T) {
	for _, dt := range DTypes() {
		x := New(dt, 3, 5)
		x.Fill(1)
		for i := range x.Numel() {
			if x.At(i) != 1 {
				t.Fatalf("%s Fill(1): At(%d) = %v", dt, i, x.At(i))
			}
		}
		x.SetAt(14, 0)
		x.SetAt(0, 0)
		if x.At(14) != 0 || x.At(0) != 0 || x.At(13) != 1 {
			t.Fatalf("%s SetAt", dt)
		}
		v, _ := x.Narrow(4, 3)
		v.Fill(0)
		if x.At(3) != 1 || x.At(4) != 0 || x.At(6) != 0 || x.At(7) != 1 {
			t.Fatalf("%s Fill on a narrowed view wrote outside it", dt)
		}
		v.SetAt(2, 1)
		if x.At(6) != 1 {
			t.Fatalf("%s SetAt on a view", dt)
		}
	}
	x := New(Float32, 4)
	mustPanic(t, "At(-1)", func() { x.At(-1) })
	mustPanic(t, "At(4)", func() { x.At(4) })
	mustPanic(t, "SetAt(4)", func() { x.SetAt(4, 0) })
	tr, _ := New(Float32, 2, 2).AsStrided([]int{2, 2}, []int{1, 2})
	mustPanic(t, "Fill strided", func() { tr.Fill(1) })
	New(Float32, 0).Fill(1) // empty: no-op
}

func TestCloneEqual(t *testing.T) {
	x, _ := FromSlice([]int32{1, 2, 3, 4, 5, 6}, 2, 3)
	c := x.Clone()
	if !Equal(x, c) || c.DType() != Int32 {
		t.Fatal("clone differs")
	}
	c.SetAt(0, 9)
	if x.At(0) != 1 || Equal(x, c) {
		t.Fatal("clone shares storage")
	}
	// A transposed view clones into a contiguous copy.
	tr, _ := x.AsStrided([]int{3, 2}, []int{1, 3})
	ct := tr.Clone()
	if !ct.IsContiguous() {
		t.Fatal("clone of a view is not contiguous")
	}
	if got, _ := ToSlice[int32](ct); !equalInts(got, []int32{1, 4, 2, 5, 3, 6}) {
		t.Fatalf("transposed clone %v", got)
	}
	if !Equal(tr, ct) {
		t.Fatal("view and its clone differ")
	}
	// Negative strides gather backwards.
	n, _ := FromSlice([]int32{1, 2, 3})
	n2, _ := n.Narrow(2, 1)
	rev, err := n2.AsStrided([]int{3}, []int{-1})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ToSlice[int32](rev.Clone()); !equalInts(got, []int32{3, 2, 1}) {
		t.Fatalf("reversed clone %v", got)
	}
	if _, err := n.AsStrided([]int{3}, []int{-1}); !errors.Is(err, ErrShape) {
		t.Fatalf("stride before storage start: %v", err)
	}

	y, _ := FromSlice([]int32{1, 2, 3, 4, 5, 6}, 3, 2)
	f, _ := FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if Equal(x, y) || Equal(x, f) || Equal(x, nil) || !Equal(nil, nil) {
		t.Fatal("Equal: shape/dtype/nil")
	}
	nan1, _ := FromSlice([]float64{math.NaN()})
	if !Equal(nan1, nan1.Clone()) {
		t.Fatal("Equal is bitwise: same NaN is equal")
	}
	z, _ := FromSlice([]float64{0})
	nz, _ := FromSlice([]float64{math.Copysign(0, -1)})
	if Equal(z, nz) {
		t.Fatal("Equal is bitwise: 0 and -0 differ")
	}
	e := New(Float32, 0, 3)
	if !Equal(e, e.Clone()) {
		t.Fatal("empty clone")
	}
}

func TestShapeValidation(t *testing.T) {
	mustPanic(t, "New negative", func() { New(Float32, -2, -3) })
	if _, err := FromBytes(Float32, make([]byte, 24), -2, -3); !errors.Is(err, ErrShape) {
		t.Fatalf("FromBytes negative: %v", err)
	}
	e, err := FromBytes(Float32, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := ToSlice[float32](e); err != nil || len(s) != 0 {
		t.Fatalf("empty FromBytes(nil): %v %v", s, err)
	}
	x := New(Float32, 6)
	if _, err := x.Reshape(-2, -3); !errors.Is(err, ErrShape) {
		t.Fatalf("Reshape negative: %v", err)
	}
}

func equalInts(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}

func BenchmarkFromFloat64sFloat16(b *testing.B) {
	data := make([]float64, 1<<16)
	for i := range data {
		data[i] = float64(i) / 7
	}
	b.SetBytes(int64(len(data) * 2))
	for b.Loop() {
		if _, err := FromFloat64s(Float16, data); err != nil {
			b.Fatal(err)
		}
	}
}
