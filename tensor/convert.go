package tensor

// Conversions between float32/float64 and the narrow floating-point storage
// types, done on bits so that the results do not depend on the host FPU.
//
// Rounding. Every conversion to a narrow type rounds once, to nearest with
// ties to even, from the exact value of its input. The FromFloat64 variants
// round directly from the float64 (PyTorch's c10 types go through float32
// first, which can round twice; for inputs that are float32 values the two
// agree). Results too small for the smallest subnormal become a zero of the
// input's sign.
//
// Overflow and special values follow PyTorch's c10 types:
//
//   - Float16, BFloat16, Float8E5M2 (IEEE-like): a value whose rounded
//     magnitude exceeds the largest finite value becomes ±Inf, as IEEE
//     round-to-nearest-even requires; ±Inf stays ±Inf.
//   - Float8E4M3 (float8_e4m3fn, as c10::Float8_e4m3fn): there is no Inf and
//     the conversion does not saturate. A value that rounds past 448 (any
//     |x| > 464; 464 itself is a tie and goes to the even 448), ±Inf and
//     NaN all become NaN (S.1111.111) with the input's sign.
//
// NaN. Float16 and BFloat16 keep the sign and the high payload bits of a NaN
// and set the quiet bit, so a quiet NaN converts back and forth unchanged.
// The float8 types produce the canonical NaN S.xxxx.111 (0x7f or 0xff), as
// c10 does; decoding any NaN pattern gives a quiet NaN of the same sign.
//
// Widening conversions (To...) are exact: every value of the narrow types is
// a float32 and a float64.

import (
	"math"
	"math/bits"
)

// fpFormat describes a small binary floating-point format of at most 16 bits.
type fpFormat struct {
	mant     uint // stored fraction bits
	exp      uint // exponent bits
	bias     int
	fn       bool // "finite": no Inf; only S.1...1.1...1 is NaN (e4m3fn)
	canonNaN bool // NaN results are the canonical all-ones-fraction pattern
}

var (
	fmtF16  = fpFormat{mant: 10, exp: 5, bias: 15}
	fmtBF16 = fpFormat{mant: 7, exp: 8, bias: 127}
	fmtE4M3 = fpFormat{mant: 3, exp: 4, bias: 7, fn: true, canonNaN: true}
	fmtE5M2 = fpFormat{mant: 2, exp: 5, bias: 15, canonNaN: true}
)

func (f fpFormat) mantMask() uint32 { return 1<<f.mant - 1 }
func (f fpFormat) expMask() uint32  { return (1<<f.exp - 1) << f.mant }
func (f fpFormat) signBit() uint32  { return 1 << (f.exp + f.mant) }

// maxFinite is the bit pattern of the largest finite positive value.
func (f fpFormat) maxFinite() uint32 {
	if f.fn {
		return (f.expMask() | f.mantMask()) - 1
	}
	return f.expMask() - 1
}

// overflow is the positive pattern a too-large value becomes: Inf, or NaN
// for a format without Inf.
func (f fpFormat) overflow() uint32 {
	if f.fn {
		return f.expMask() | f.mantMask()
	}
	return f.expMask()
}

// nan returns the positive quiet NaN carrying payload (already shifted to
// the format's fraction width) where the format keeps payloads.
func (f fpFormat) nan(payload uint32) uint32 {
	if f.canonNaN {
		return f.expMask() | f.mantMask()
	}
	return f.expMask() | 1<<(f.mant-1) | payload&f.mantMask()
}

// fromFloat64 rounds x to the format, once, to nearest even.
func (f fpFormat) fromFloat64(x float64) uint32 {
	b := math.Float64bits(x)
	sign := uint32(b>>63) * f.signBit()
	a := b &^ (1 << 63)
	switch {
	case a > 0x7ff0000000000000: // NaN
		return sign | f.nan(uint32(a>>(52-f.mant)))
	case a == 0x7ff0000000000000: // Inf
		return sign | f.overflow()
	case a == 0:
		return sign
	}
	// |x| = m * 2^e2, m an integer.
	e := int(a >> 52)
	m := a & (1<<52 - 1)
	if e == 0 {
		e = 1 // float64 subnormal
	} else {
		m |= 1 << 52
	}
	e2 := e - 1075
	top := e2 + bits.Len64(m) - 1 // exponent of the leading bit
	emin := 1 - f.bias            // exponent of the smallest normal
	qmin := emin - int(f.mant)    // exponent of the smallest subnormal
	q := max(top, emin) - int(f.mant)
	// q-e2 >= 52-mant > 0: the result is m / 2^shift quanta of 2^q, rounded.
	shift := q - e2
	var r uint64
	if shift < 64 {
		r = m >> shift
		rem := m & (1<<shift - 1)
		half := uint64(1) << (shift - 1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
	} // else m < 2^53 is far below half a quantum: r = 0.
	if r == 0 {
		return sign
	}
	// Subnormals (q == qmin) encode as r; for normals r carries the implicit
	// bit, which adds one to the exponent field. A carry out of the fraction
	// from rounding moves to the next binade by itself.
	enc := uint64(q-qmin)<<f.mant + r
	if enc > uint64(f.maxFinite()) {
		return sign | f.overflow()
	}
	return sign | uint32(enc)
}

// fromFloat32 rounds x to the format. Non-NaN float32 values widen to
// float64 exactly, so this rounds once too.
func (f fpFormat) fromFloat32(x float32) uint32 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return (b>>31)*f.signBit() | f.nan((b&0x7fffff)>>(23-f.mant))
	}
	return f.fromFloat64(float64(x))
}

// widen returns the bits of h in a wider IEEE format with tmant fraction
// bits, texp exponent bits and bias tbias, in which every value of f,
// subnormals included, is normal.
func (f fpFormat) widen(h uint32, tmant, texp uint, tbias int) uint64 {
	sign := uint64(h>>(f.exp+f.mant)&1) << (tmant + texp)
	e := int(h >> f.mant & (1<<f.exp - 1))
	m := uint64(h & f.mantMask())
	tinf := uint64(1<<texp-1) << tmant
	switch {
	case f.fn && uint32(h)&^f.signBit() == f.expMask()|f.mantMask():
		return sign | tinf | 1<<(tmant-1)
	case !f.fn && e == 1<<f.exp-1: // Inf or NaN, payload kept
		return sign | tinf | m<<(tmant-f.mant)
	case e == 0:
		if m == 0 {
			return sign
		}
		l := bits.Len64(m)
		top := 1 - f.bias - int(f.mant) + l - 1
		frac := m << (tmant + 1 - uint(l)) & (1<<tmant - 1)
		return sign | uint64(top+tbias)<<tmant | frac
	}
	return sign | uint64(e-f.bias+tbias)<<tmant | m<<(tmant-f.mant)
}

func (f fpFormat) toFloat64(h uint32) float64 {
	return math.Float64frombits(f.widen(h, 52, 11, 1023))
}

func (f fpFormat) toFloat32(h uint32) float32 {
	return math.Float32frombits(uint32(f.widen(h, 23, 8, 127)))
}

// Float16FromFloat32 returns the IEEE binary16 bits nearest to f (ties to
// even; overflow to ±Inf; NaN stays a quiet NaN).
func Float16FromFloat32(f float32) uint16 { return uint16(fmtF16.fromFloat32(f)) }

// Float16FromFloat64 returns the IEEE binary16 bits nearest to f, rounded
// once, directly from the float64.
func Float16FromFloat64(f float64) uint16 { return uint16(fmtF16.fromFloat64(f)) }

// Float16ToFloat32 returns the value of binary16 bits h, exactly.
func Float16ToFloat32(h uint16) float32 { return fmtF16.toFloat32(uint32(h)) }

// Float16ToFloat64 returns the value of binary16 bits h, exactly.
func Float16ToFloat64(h uint16) float64 { return fmtF16.toFloat64(uint32(h)) }

// BFloat16FromFloat32 returns the bfloat16 bits nearest to f (ties to even;
// overflow to ±Inf; NaN stays a quiet NaN).
func BFloat16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // keep sign and high payload, quiet
	}
	// bfloat16 is float32 with the low 16 bits dropped: round on the bits.
	// A carry runs into the exponent, up to Inf, as it should.
	return uint16((b + 0x7fff + (b >> 16 & 1)) >> 16)
}

// BFloat16FromFloat64 returns the bfloat16 bits nearest to f, rounded once,
// directly from the float64.
func BFloat16FromFloat64(f float64) uint16 { return uint16(fmtBF16.fromFloat64(f)) }

// BFloat16ToFloat32 returns the value of bfloat16 bits h, exactly.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// BFloat16ToFloat64 returns the value of bfloat16 bits h, exactly.
func BFloat16ToFloat64(h uint16) float64 { return float64(BFloat16ToFloat32(h)) }

// Float8E4M3FromFloat32 returns the float8_e4m3fn bits nearest to f. As in
// c10::Float8_e4m3fn it does not saturate: |f| > 464, ±Inf and NaN become
// NaN (0x7f, or 0xff when negative).
func Float8E4M3FromFloat32(f float32) uint8 { return uint8(fmtE4M3.fromFloat32(f)) }

// Float8E4M3FromFloat64 is Float8E4M3FromFloat32 for a float64, rounded once.
func Float8E4M3FromFloat64(f float64) uint8 { return uint8(fmtE4M3.fromFloat64(f)) }

// Float8E4M3ToFloat32 returns the value of float8_e4m3fn bits b, exactly;
// 0x7f and 0xff are NaN.
func Float8E4M3ToFloat32(b uint8) float32 { return fmtE4M3.toFloat32(uint32(b)) }

// Float8E4M3ToFloat64 returns the value of float8_e4m3fn bits b, exactly.
func Float8E4M3ToFloat64(b uint8) float64 { return fmtE4M3.toFloat64(uint32(b)) }

// Float8E5M2FromFloat32 returns the float8_e5m2 bits nearest to f (ties to
// even; overflow to ±Inf as in c10::Float8_e5m2; NaN becomes 0x7f or 0xff).
func Float8E5M2FromFloat32(f float32) uint8 { return uint8(fmtE5M2.fromFloat32(f)) }

// Float8E5M2FromFloat64 is Float8E5M2FromFloat32 for a float64, rounded once.
func Float8E5M2FromFloat64(f float64) uint8 { return uint8(fmtE5M2.fromFloat64(f)) }

// Float8E5M2ToFloat32 returns the value of float8_e5m2 bits b, exactly.
func Float8E5M2ToFloat32(b uint8) float32 { return fmtE5M2.toFloat32(uint32(b)) }

// Float8E5M2ToFloat64 returns the value of float8_e5m2 bits b, exactly.
func Float8E5M2ToFloat64(b uint8) float64 { return fmtE5M2.toFloat64(uint32(b)) }
