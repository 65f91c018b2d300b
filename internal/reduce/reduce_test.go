package reduce

import (
	"errors"
	"math"
	"testing"

	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// inputs are three ranks' values, chosen so that every op gives a result
// that is exact in every dtype (float8 e4m3 included) and that tells the
// ops apart. The kernels round narrow types after every combine, so every
// partial sum and product is exact in float8 e5m2 too. Unsigned and bool
// dtypes take the absolute values.
var inputs = [3][8]float64{
	{3, -2, 0, 1, 5, -1, 2, 2},
	{-1, 4, 2, 1, 0, -3, 3, 1},
	{2, 1, -2, 0, 1, 2, 1, 3},
}

// reference computes op over vals the slow, obvious way, in float64 for
// arithmetic and int64 for the bitwise ops, then applies the dtype's cast.
func reference(t *testing.T, dt tensor.DType, op reduceop.ReduceOp, vals []float64) float64 {
	t.Helper()
	if dt == tensor.Bool {
		// Bool is logic: SUM, MAX, BOR and AVG are OR; PRODUCT, MIN and
		// BAND are AND; BXOR is XOR; PREMUL_SUM is OR of x*f != 0.
		or, and, xor := false, true, false
		for _, v := range vals {
			b := v != 0
			if op.Type == reduceop.PreMulSum {
				b = b && op.Factor != 0
			}
			or, and, xor = or || b, and && b, xor != b
		}
		var r bool
		switch op.Type {
		case reduceop.Sum, reduceop.Max, reduceop.BOr, reduceop.Avg, reduceop.PreMulSum:
			r = or
		case reduceop.Product, reduceop.Min, reduceop.BAnd:
			r = and
		case reduceop.BXor:
			r = xor
		}
		if r {
			return 1
		}
		return 0
	}
	acc := vals[0]
	if op.Type == reduceop.PreMulSum {
		acc = castTo(dt, acc*op.Factor)
	}
	for _, v := range vals[1:] {
		switch op.Type {
		case reduceop.Sum, reduceop.Avg:
			acc += v
		case reduceop.PreMulSum:
			acc += castTo(dt, v*op.Factor)
		case reduceop.Product:
			acc *= v
		case reduceop.Min:
			acc = math.Min(acc, v)
		case reduceop.Max:
			acc = math.Max(acc, v)
		case reduceop.BAnd:
			acc = float64(int64(acc) & int64(v))
		case reduceop.BOr:
			acc = float64(int64(acc) | int64(v))
		case reduceop.BXor:
			acc = float64(int64(acc) ^ int64(v))
		default:
			t.Fatalf("reference: no rule for %v", op)
		}
	}
	if op.Type == reduceop.Avg {
		if dt.IsInteger() {
			acc = float64(int64(acc) / int64(len(vals))) // truncates toward zero, as torch's integer division of the sum
		} else {
			acc /= float64(len(vals))
		}
	}
	return castTo(dt, acc)
}

// castTo rounds v as storing it in dt would.
func castTo(dt tensor.DType, v float64) float64 {
	tt, err := tensor.FromFloat64s(dt, []float64{v})
	if err != nil {
		panic(err)
	}
	return tt.At(0)
}

// TestKernelsAgainstReference runs every dtype × reduce op over three
// ranks' inputs through For's kernel, as a host algorithm does (Pre on each
// contribution, Combine in rank order, Post once), and compares each
// element with reference.
func TestKernelsAgainstReference(t *testing.T) {
	ops := []reduceop.ReduceOp{reduceop.SUM, reduceop.AVG, reduceop.PRODUCT, reduceop.MIN, reduceop.MAX,
		reduceop.BAND, reduceop.BOR, reduceop.BXOR, reduceop.PremulSum(2), reduceop.PremulSum(0.5)}
	for _, dt := range tensor.DTypes() {
		for _, op := range ops {
			t.Run(dt.String()+"/"+op.String(), func(t *testing.T) {
				k, err := For(dt, op)
				if op.Bitwise() && !dt.IsInteger() {
					if !errors.Is(err, reduceop.ErrInvalid) {
						t.Fatalf("For(%v, %v) = %v, want an error wrapping reduceop.ErrInvalid", dt, op, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("For(%v, %v): %v", dt, op, err)
				}
				if k.ElemSize != dt.Size() {
					t.Fatalf("ElemSize %d, want %d", k.ElemSize, dt.Size())
				}
				var ranks [3][]float64
				var bufs [3][]byte
				for r := range inputs {
					ranks[r] = make([]float64, len(inputs[r]))
					for i, v := range inputs[r] {
						if dt == tensor.Uint8 || dt == tensor.Bool {
							v = math.Abs(v)
						}
						ranks[r][i] = v
					}
					tt, err := tensor.FromFloat64s(dt, ranks[r])
					if err != nil {
						t.Fatal(err)
					}
					bufs[r] = tt.Bytes()
					if k.Pre != nil {
						k.Pre(bufs[r])
					}
				}
				for r := 1; r < len(bufs); r++ {
					k.Combine(bufs[0], bufs[r])
				}
				if k.Post != nil {
					k.Post(bufs[0], len(bufs))
				}
				got, err := tensor.FromBytes(dt, bufs[0], len(inputs[0]))
				if err != nil {
					t.Fatal(err)
				}
				for i := range inputs[0] {
					want := reference(t, dt, op, []float64{ranks[0][i], ranks[1][i], ranks[2][i]})
					if g := got.At(i); g != want {
						t.Errorf("element %d: %v of %v, %v, %v = %v, want %v",
							i, op, ranks[0][i], ranks[1][i], ranks[2][i], g, want)
					}
				}
			})
		}
	}
}

// TestForRejectsUnknownOp checks that an op kind outside the enum is an
// error, not a silent SUM.
func TestForRejectsUnknownOp(t *testing.T) {
	if _, err := For(tensor.Float32, reduceop.ReduceOp{Type: 42}); !errors.Is(err, reduceop.ErrInvalid) {
		t.Fatalf("For(float32, Type(42)) = %v, want an error wrapping reduceop.ErrInvalid", err)
	}
}

// TestMinMaxNaN checks that MIN and MAX propagate NaN as torch does.
func TestMinMaxNaN(t *testing.T) {
	for _, op := range []reduceop.ReduceOp{reduceop.MIN, reduceop.MAX} {
		k, err := For(tensor.Float32, op)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := tensor.FromSlice([]float32{1, float32(math.NaN())})
		b, _ := tensor.FromSlice([]float32{float32(math.NaN()), 2})
		k.Combine(a.Bytes(), b.Bytes())
		if !math.IsNaN(a.At(0)) || !math.IsNaN(a.At(1)) {
			t.Errorf("%v with NaN gave %v, %v; want NaN, NaN", op, a.At(0), a.At(1))
		}
	}
}
