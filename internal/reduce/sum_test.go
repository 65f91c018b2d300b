package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestVectorSum checks the vectorised float sums against the scalar loop,
// bit for bit, on every length up to 200 and at unaligned starts (the
// assembly loads unaligned), with infinities, NaNs, signed zeros and
// subnormals among the values.
func TestVectorSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specials := []float64{math.Inf(1), math.Inf(-1), math.NaN(), math.Copysign(0, -1), 0, 5e-324, 1e-40, math.MaxFloat32}
	val := func() float64 {
		if rng.IntN(10) == 0 {
			return specials[rng.IntN(len(specials))]
		}
		return rng.NormFloat64() * 1e3
	}
	for n := 0; n <= 200; n++ {
		for _, off := range []int{0, 1, 3} {
			d32, s32 := make([]float32, n+off), make([]float32, n+off)
			d64, s64 := make([]float64, n+off), make([]float64, n+off)
			for i := range d32 {
				d32[i], s32[i] = float32(val()), float32(val())
				d64[i], s64[i] = val(), val()
			}
			w32, w64 := append([]float32(nil), d32...), append([]float64(nil), d64...)
			sum(w32[off:], s32[off:])
			sum(w64[off:], s64[off:])
			sumFloat32(d32[off:], s32[off:])
			sumFloat64(d64[off:], s64[off:])
			for i := range d32 {
				if math.Float32bits(d32[i]) != math.Float32bits(w32[i]) {
					t.Fatalf("float32 n %d off %d: element %d = %v, scalar %v", n, off, i, d32[i], w32[i])
				}
				if math.Float64bits(d64[i]) != math.Float64bits(w64[i]) {
					t.Fatalf("float64 n %d off %d: element %d = %v, scalar %v", n, off, i, d64[i], w64[i])
				}
			}
		}
	}
}

// BenchmarkSum is the float32 and float64 SUM kernel on buffers that stay
// in cache (64 KiB) and that do not (8 MiB).
func BenchmarkSum(b *testing.B) {
	for _, n := range []int{64 << 10, 8 << 20} {
		for _, k := range []struct {
			name string
			f    func(d, s []byte)
		}{
			{"float32", func(d, s []byte) { sumFloat32(view[float32](d), view[float32](s)) }},
			{"float64", func(d, s []byte) { sumFloat64(view[float64](d), view[float64](s)) }},
			{"float32-scalar", func(d, s []byte) { sum(view[float32](d), view[float32](s)) }},
		} {
			b.Run(k.name+"/"+map[int]string{64 << 10: "64KiB", 8 << 20: "8MiB"}[n], func(b *testing.B) {
				d, s := make([]byte, n), make([]byte, n)
				b.SetBytes(int64(n))
				for b.Loop() {
					k.f(d, s)
				}
			})
		}
	}
}
