package tensor

import (
	"math"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
)

// A conversion under test, with its reference description.
type convCase struct {
	name   string
	f      fpFormat
	n      int // number of bit patterns
	from32 func(float32) uint32
	from64 func(float64) uint32
	to32   func(uint32) float32
	to64   func(uint32) float64
}

var convCases = []convCase{
	{"float16", fmtF16, 1 << 16,
		func(x float32) uint32 { return uint32(Float16FromFloat32(x)) },
		func(x float64) uint32 { return uint32(Float16FromFloat64(x)) },
		func(h uint32) float32 { return Float16ToFloat32(uint16(h)) },
		func(h uint32) float64 { return Float16ToFloat64(uint16(h)) }},
	{"bfloat16", fmtBF16, 1 << 16,
		func(x float32) uint32 { return uint32(BFloat16FromFloat32(x)) },
		func(x float64) uint32 { return uint32(BFloat16FromFloat64(x)) },
		func(h uint32) float32 { return BFloat16ToFloat32(uint16(h)) },
		func(h uint32) float64 { return BFloat16ToFloat64(uint16(h)) }},
	{"float8_e4m3fn", fmtE4M3, 1 << 8,
		func(x float32) uint32 { return uint32(Float8E4M3FromFloat32(x)) },
		func(x float64) uint32 { return uint32(Float8E4M3FromFloat64(x)) },
		func(h uint32) float32 { return Float8E4M3ToFloat32(uint8(h)) },
		func(h uint32) float64 { return Float8E4M3ToFloat64(uint8(h)) }},
	{"float8_e5m2", fmtE5M2, 1 << 8,
		func(x float32) uint32 { return uint32(Float8E5M2FromFloat32(x)) },
		func(x float64) uint32 { return uint32(Float8E5M2FromFloat64(x)) },
		func(h uint32) float32 { return Float8E5M2ToFloat32(uint8(h)) },
		func(h uint32) float64 { return Float8E5M2ToFloat64(uint8(h)) }},
}

// refValue is the value of positive pattern p by the textbook formula, with
// the exponent unbounded: for p = maxFinite+1 it is the next value up (2^16
// for float16, 480 for e4m3fn), the point past which values overflow.
func refValue(f fpFormat, p uint32) float64 {
	e := int(p >> f.mant)
	m := float64(p & f.mantMask())
	if e == 0 {
		return math.Ldexp(m, 1-f.bias-int(f.mant))
	}
	return math.Ldexp(float64(uint32(1)<<f.mant)+m, e-f.bias-int(f.mant))
}

// refRound is a slow reference: binary search for the neighbours of |x| in
// the value table, compare distances exactly with big.Float, break ties to
// the even pattern. Overflow gives maxFinite+1, which is the overflow
// pattern in every format (Inf, or NaN for e4m3fn).
func refRound(f fpFormat, x float64) uint32 {
	var sign uint32
	if math.Signbit(x) {
		sign = f.signBit()
	}
	a := math.Abs(x)
	top := f.maxFinite() + 1
	if a >= refValue(f, top) {
		return sign | top
	}
	// Largest p with value(p) <= a.
	p := uint32(sort.Search(int(top)+1, func(i int) bool { return refValue(f, uint32(i)) > a })) - 1
	lo, hi := refValue(f, p), refValue(f, p+1)
	if a == lo {
		return sign | p
	}
	const prec = 2200 // exact for any difference of two float64s
	d1 := new(big.Float).SetPrec(prec).Sub(new(big.Float).SetFloat64(a), new(big.Float).SetFloat64(lo))
	d2 := new(big.Float).SetPrec(prec).Sub(new(big.Float).SetFloat64(hi), new(big.Float).SetFloat64(a))
	switch d1.Cmp(d2) {
	case -1:
		return sign | p
	case 1:
		return sign | (p + 1)
	}
	if p&1 == 0 {
		return sign | p
	}
	return sign | (p + 1)
}

func isNaNBits(f fpFormat, h uint32) bool {
	a := h &^ f.signBit()
	if f.fn {
		return a == f.expMask()|f.mantMask()
	}
	return a > f.expMask()
}

func TestKnownBits(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	type kb struct {
		x    float64
		want uint32
	}
	tests := map[string][]kb{
		"float16": {
			{1, 0x3c00}, {-2, 0xc000}, {0, 0}, {math.Copysign(0, -1), 0x8000},
			{65504, 0x7bff}, {-65504, 0xfbff},
			{0x1p-14, 0x0400}, {0x1p-24, 0x0001}, {1023 * 0x1p-24, 0x03ff},
			{1 + 0x1p-11, 0x3c00}, {1 + 3*0x1p-11, 0x3c02}, {1 + 0x1p-11 + 0x1p-40, 0x3c01},
			{-(1 + 0x1p-11), 0xbc00}, {-(1 + 3*0x1p-11), 0xbc02},
			{1.5 * 0x1p-24, 0x0002}, {2.5 * 0x1p-24, 0x0002}, {1023.5 * 0x1p-24, 0x0400},
			{65519.99, 0x7bff}, {65520, 0x7c00}, {1e6, 0x7c00}, {-1e6, 0xfc00},
			{0x1p-25, 0}, {0x1p-25 + 0x1p-60, 1}, {1e-10, 0}, {-1e-10, 0x8000}, {-0x1p-25, 0x8000},
			{inf, 0x7c00}, {-inf, 0xfc00}, {nan, 0x7e00},
			{1.0 / 3, 0x3555}, {0.1, 0x2e66},
		},
		"bfloat16": {
			{1, 0x3f80}, {-2, 0xc000}, {math.Copysign(0, -1), 0x8000},
			{refValue(fmtBF16, 0x7f7f), 0x7f7f}, {0x1p-126, 0x0080}, {0x1p-133, 0x0001}, {127 * 0x1p-133, 0x007f},
			{1 + 0x1p-8, 0x3f80}, {1 + 3*0x1p-8, 0x3f82}, {-(1 + 3*0x1p-8), 0xbf82},
			{math.MaxFloat32, 0x7f80}, {1e39, 0x7f80}, {-1e39, 0xff80},
			{0x1p-134, 0}, {-0x1p-134, 0x8000}, {0x1p-149, 0}, {1.5 * 0x1p-133, 0x0002},
			{inf, 0x7f80}, {-inf, 0xff80}, {nan, 0x7fc0},
			{1.0 / 3, 0x3eab},
		},
		"float8_e4m3fn": {
			{1, 0x38}, {-2, 0xc0}, {math.Copysign(0, -1), 0x80},
			{448, 0x7e}, {-448, 0xfe}, {0x1p-6, 0x08}, {0x1p-9, 0x01}, {7 * 0x1p-9, 0x07},
			{1 + 1.0/16, 0x38}, {1 + 3.0/16, 0x3a}, {-(1 + 3.0/16), 0xba}, {7.5 * 0x1p-9, 0x08},
			{464, 0x7e}, {464.01, 0x7f}, {480, 0x7f}, {1e6, 0x7f}, {-1e6, 0xff},
			{0x1p-10, 0}, {0x1p-10 * 1.0001, 0x01}, {-0x1p-12, 0x80},
			{inf, 0x7f}, {-inf, 0xff}, {nan, 0x7f}, {math.Copysign(nan, -1), 0xff},
		},
		"float8_e5m2": {
			{1, 0x3c}, {-2, 0xc0}, {math.Copysign(0, -1), 0x80},
			{57344, 0x7b}, {0x1p-14, 0x04}, {0x1p-16, 0x01}, {3 * 0x1p-16, 0x03},
			{1 + 1.0/8, 0x3c}, {1 + 3.0/8, 0x3e}, {3.5 * 0x1p-16, 0x04},
			{61439, 0x7b}, {61440, 0x7c}, {1e6, 0x7c}, {-1e6, 0xfc},
			{0x1p-17, 0}, {-0x1p-17, 0x80}, {0x1p-17 * 1.01, 0x01},
			{inf, 0x7c}, {-inf, 0xfc}, {nan, 0x7f},
		},
	}
	for _, c := range convCases {
		for _, k := range tests[c.name] {
			if got := c.from64(k.x); got != k.want {
				t.Errorf("%s from float64 %v (%x): got %#x, want %#x", c.name, k.x, math.Float64bits(k.x), got, k.want)
			}
			if x32 := float32(k.x); float64(x32) == k.x || k.x != k.x {
				if got := c.from32(x32); got != k.want {
					t.Errorf("%s from float32 %v: got %#x, want %#x", c.name, x32, got, k.want)
				}
			}
			if !isNaNBits(c.f, k.want) && !(c.f.fn && k.x != k.x) {
				// Values that are exact must come back.
				if back := c.to64(k.want); c.from64(back) != k.want {
					t.Errorf("%s %#x -> %v does not round-trip", c.name, k.want, back)
				}
			}
		}
	}
	// Decoding named patterns.
	decodes := []struct {
		got, want float64
	}{
		{Float16ToFloat64(0x3c00), 1}, {Float16ToFloat64(0x0001), 0x1p-24}, {Float16ToFloat64(0x7bff), 65504},
		{BFloat16ToFloat64(0x0001), 0x1p-133}, {Float8E4M3ToFloat64(0x7e), 448}, {Float8E4M3ToFloat64(0x01), 0x1p-9},
		{Float8E4M3ToFloat64(0x7c), 384}, {Float8E5M2ToFloat64(0x7b), 57344}, {Float8E5M2ToFloat64(0x7c), inf},
		{Float8E5M2ToFloat64(0xfc), -inf}, {Float16ToFloat64(0xfc00), -inf},
	}
	for i, d := range decodes {
		if d.got != d.want {
			t.Errorf("decode %d: got %v, want %v", i, d.got, d.want)
		}
	}
	if v := Float8E4M3ToFloat32(0xff); !math.IsNaN(float64(v)) || !math.Signbit(float64(v)) {
		t.Errorf("e4m3fn 0xff decodes to %v, want -NaN", v)
	}
	if v := Float8E4M3ToFloat32(0x78); v != 256 {
		t.Errorf("e4m3fn 0x78 (exponent all ones, not NaN) decodes to %v, want 256", v)
	}
	// NaN payload and quieting.
	snan32 := math.Float32frombits(0xff800001) // negative signalling NaN, low payload
	if got := Float16FromFloat32(snan32); got != 0xfe00 {
		t.Errorf("float16 from -sNaN: %#x, want 0xfe00", got)
	}
	if got := Float16FromFloat32(math.Float32frombits(0x7fa02000)); got != 0x7f01 {
		t.Errorf("float16 from NaN payload: %#x, want 0x7f01", got)
	}
	if got := BFloat16FromFloat32(snan32); got != 0xffc0 {
		t.Errorf("bfloat16 from -sNaN: %#x, want 0xffc0", got)
	}
	if got := BFloat16FromFloat64(math.Float64frombits(0x7ff0000000000001)); got != 0x7fc0 {
		t.Errorf("bfloat16 from float64 sNaN: %#x, want 0x7fc0", got)
	}
}

// Every pattern decodes to its textbook value and converts back to itself,
// through float32 and float64; NaNs stay NaNs of the same sign, quiet.
func TestRoundTripExhaustive(t *testing.T) {
	for _, c := range convCases {
		nans := 0
		for i := 0; i < c.n; i++ {
			h := uint32(i)
			v32, v64 := c.to32(h), c.to64(h)
			if isNaNBits(c.f, h) {
				nans++
				if !math.IsNaN(float64(v32)) || !math.IsNaN(v64) {
					t.Fatalf("%s %#x: NaN decodes to %v / %v", c.name, h, v32, v64)
				}
				if math.Signbit(float64(v32)) != (h&c.f.signBit() != 0) || math.Signbit(v64) != (h&c.f.signBit() != 0) {
					t.Fatalf("%s %#x: NaN sign lost", c.name, h)
				}
				for _, back := range []uint32{c.from32(v32), c.from64(v64)} {
					if !isNaNBits(c.f, back) || back&c.f.signBit() != h&c.f.signBit() {
						t.Fatalf("%s %#x: NaN comes back as %#x", c.name, h, back)
					}
					if !c.f.fn && back&(1<<(c.f.mant-1)) == 0 {
						t.Fatalf("%s %#x: NaN comes back signalling (%#x)", c.name, h, back)
					}
					if !c.f.canonNaN && h&(1<<(c.f.mant-1)) != 0 && back != h {
						t.Fatalf("%s quiet NaN %#x comes back as %#x", c.name, h, back)
					}
				}
				continue
			}
			if float64(v32) != v64 {
				t.Fatalf("%s %#x: float32 %v != float64 %v", c.name, h, v32, v64)
			}
			if a := h &^ c.f.signBit(); a <= c.f.maxFinite() {
				want := refValue(c.f, a)
				if h != a {
					want = -want
				}
				if v64 != want || math.Signbit(v64) != (h != a) {
					t.Fatalf("%s %#x: decodes to %v, want %v", c.name, h, v64, want)
				}
			} else if !math.IsInf(v64, 0) {
				t.Fatalf("%s %#x: want ±Inf, got %v", c.name, h, v64)
			}
			if b := c.from32(v32); b != h {
				t.Fatalf("%s %#x -> %v -> %#x (float32)", c.name, h, v32, b)
			}
			if b := c.from64(v64); b != h {
				t.Fatalf("%s %#x -> %v -> %#x (float64)", c.name, h, v64, b)
			}
		}
		wantNaNs := map[string]int{"float16": 2046, "bfloat16": 254, "float8_e4m3fn": 2, "float8_e5m2": 6}[c.name]
		if nans != wantNaNs {
			t.Errorf("%s: %d NaN patterns, want %d", c.name, nans, wantNaNs)
		}
	}
}

// testInputs returns float64 inputs that probe format f: all midpoints
// between neighbours and their float32/float64 neighbours, random values
// across and beyond the format's range, and random float32 bit patterns.
func testInputs(f fpFormat, rng *rand.Rand, nRandom int) []float64 {
	var xs []float64
	top := f.maxFinite() + 1
	step := uint32(1)
	if top > 4096 {
		step = 7 // a sample of midpoints suffices for the 16-bit formats
	}
	for p := uint32(0); p < top; p += step {
		mid := (refValue(f, p) + refValue(f, p+1)) / 2
		m32 := float32(mid)
		xs = append(xs, mid, math.Nextafter(mid, 0), math.Nextafter(mid, math.Inf(1)),
			float64(math.Nextafter32(m32, 0)), float64(math.Nextafter32(m32, float32(math.Inf(1)))),
			refValue(f, p))
	}
	emin, emax := 1-f.bias-int(f.mant)-3, (1<<f.exp)-f.bias+2
	for range nRandom {
		m := 1 + rng.Float64()
		xs = append(xs, math.Ldexp(m, emin+rng.IntN(emax-emin+1)))
		xs = append(xs, float64(math.Float32frombits(rng.Uint32())))
		xs = append(xs, math.Float64frombits(rng.Uint64()))
	}
	for i := range xs {
		if rng.IntN(2) == 0 {
			xs[i] = -xs[i]
		}
	}
	return xs
}

// The conversions agree with the slow big.Float reference.
func TestConvertMatchesReference(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range convCases {
		checked := 0
		for _, x := range testInputs(c.f, rng, n) {
			if math.IsNaN(x) {
				continue
			}
			want := refRound(c.f, x)
			if got := c.from64(x); got != want {
				t.Fatalf("%s from float64 %v (%#x): got %#x, want %#x", c.name, x, math.Float64bits(x), got, want)
			}
			if x32 := float32(x); float64(x32) == x {
				if got := c.from32(x32); got != want {
					t.Fatalf("%s from float32 %v (%#x): got %#x, want %#x", c.name, x32, math.Float32bits(x32), got, want)
				}
			}
			checked++
		}
		t.Logf("%s: %d inputs checked", c.name, checked)
	}
}

// Rounding from float64 is single: the float32 route would round twice.
func TestFromFloat64RoundsOnce(t *testing.T) {
	// Just above the float16 midpoint 1+2^-11, but closer to it than float32
	// can resolve: via float32 it becomes the tie and rounds down to 1.
	x := 1 + 0x1p-11 + 0x1p-30
	if float32(x) != float32(1+0x1p-11) {
		t.Fatal("test premise: float32 should land on the tie")
	}
	if got := Float16FromFloat64(x); got != 0x3c01 {
		t.Errorf("Float16FromFloat64(%v) = %#x, want 0x3c01", x, got)
	}
	if got := Float16FromFloat32(float32(x)); got != 0x3c00 {
		t.Errorf("Float16FromFloat32(float32(%v)) = %#x, want 0x3c00", x, got)
	}
	y := 1 + 0x1p-8 + 0x1p-30
	if got := BFloat16FromFloat64(y); got != 0x3f81 {
		t.Errorf("BFloat16FromFloat64(%v) = %#x, want 0x3f81", y, got)
	}
}

// The bfloat16 bit-trick fast path agrees with the general rounding.
func TestBFloat16FastPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		b := rng.Uint32()
		if rng.IntN(4) == 0 {
			b = b&0xffff0000 | 0x8000 // ties
		}
		x := math.Float32frombits(b)
		if got, want := uint32(BFloat16FromFloat32(x)), fmtBF16.fromFloat32(x); got != want {
			t.Fatalf("BFloat16FromFloat32(%#x) = %#x, general path %#x", b, got, want)
		}
	}
}

// c10FromFloat32 transcribes the algorithm of PyTorch's
// c10::detail::fp8e4m3fn_from_fp32_value (e4m3) and fp8e5m2_from_fp32_value,
// to check that the float8 conversions match PyTorch on float32 inputs.
func c10FromFloat32(e4m3 bool, f float32) uint8 {
	fb := math.Float32bits(f)
	sign := fb & 0x80000000
	fb ^= sign
	var r uint8
	var max, denormMask, minNormal, mantShift, expAdj, roundBias uint32
	if e4m3 {
		max, denormMask, minNormal, mantShift, expAdj, roundBias = 1087<<20, 141<<23, 121<<23, 20, 7, 0x7ffff
	} else {
		max, denormMask, minNormal, mantShift, expAdj, roundBias = 143<<23, 134<<23, 113<<23, 21, 15, 0xfffff
	}
	switch {
	case fb >= max:
		r = 0x7f
		if !e4m3 && fb <= 0x7f800000 {
			r = 0x7c
		}
	case fb < minNormal:
		fb = math.Float32bits(math.Float32frombits(fb) + math.Float32frombits(denormMask))
		r = uint8(fb - denormMask)
	default:
		odd := fb >> mantShift & 1
		fb += (expAdj-127)<<23 + roundBias
		fb += odd
		r = uint8(fb >> mantShift)
	}
	return r | uint8(sign>>24)
}

func TestFloat8MatchesC10(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 300000 {
		var x float32
		switch rng.IntN(3) {
		case 0:
			x = math.Float32frombits(rng.Uint32())
		case 1:
			x = float32(math.Ldexp(1+rng.Float64(), rng.IntN(40)-25))
		default: // exact ties and neighbours within fp8 range
			x = float32(math.Ldexp(float64(rng.IntN(64))+0.5, rng.IntN(30)-22))
			switch rng.IntN(3) {
			case 1:
				x = math.Nextafter32(x, 2*x)
			case 2:
				x = math.Nextafter32(x, 0)
			}
		}
		if rng.IntN(2) == 0 {
			x = -x
		}
		if got, want := Float8E4M3FromFloat32(x), c10FromFloat32(true, x); got != want {
			t.Fatalf("e4m3fn(%v %#x): got %#x, c10 %#x", x, math.Float32bits(x), got, want)
		}
		if got, want := Float8E5M2FromFloat32(x), c10FromFloat32(false, x); got != want {
			t.Fatalf("e5m2(%v %#x): got %#x, c10 %#x", x, math.Float32bits(x), got, want)
		}
	}
}

func BenchmarkFloat16FromFloat32(b *testing.B) {
	x := float32(1.2345)
	var s uint16
	for b.Loop() {
		s += Float16FromFloat32(x)
	}
	_ = s
}
