package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// Tensor makes a tensor of dt holding vals on the suite's device.
func (s *Suite) Tensor(dt tensor.DType, vals []float64) *tensor.Tensor {
	GinkgoHelper()
	h, err := tensor.FromFloat64s(dt, vals)
	Expect(err).NotTo(HaveOccurred())
	d, err := s.Upload(h)
	Expect(err).NotTo(HaveOccurred())
	return d
}

// Zeros makes a zeroed tensor of n elements on the suite's device.
func (s *Suite) Zeros(dt tensor.DType, n int) *tensor.Tensor {
	GinkgoHelper()
	return s.Tensor(dt, make([]float64, n))
}

// Values reads a tensor back as float64s.
func (s *Suite) Values(t *tensor.Tensor) []float64 {
	GinkgoHelper()
	h, err := s.Download(t)
	Expect(err).NotTo(HaveOccurred())
	v, err := h.Float64s()
	Expect(err).NotTo(HaveOccurred())
	return v
}

// Done waits for an issued op and fails the spec on any error.
func (s *Suite) Done(w backend.Work, err error) {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	Expect(w).NotTo(BeNil())
	ctx, cancel := s.Ctx()
	defer cancel()
	for _, wait := range []func(context.Context) error{w.Wait, w.WaitHost} {
		err := wait(ctx)
		if err != nil && ctx.Err() != nil {
			// Say why the wait was cut short: another rank failed the spec.
			Fail(fmt.Sprintf("%v (the wait ended with: %v)", context.Cause(ctx), err))
		}
		Expect(err).NotTo(HaveOccurred())
	}
}

func isUnsupported(err error) bool { return errors.Is(err, backend.ErrUnsupported) }

// Gate skips the spec with the reason the run configured for id
// (RankConfig.Skip), for behaviours a backend documents it lacks.
func (s *Suite) Gate(id string) {
	if why, ok := s.skips[id]; ok {
		Skip(fmt.Sprintf("%s: %s", id, why))
	}
}

// SkipUnsupported skips the spec when the backend does not implement the op.
func (s *Suite) SkipUnsupported(err error) {
	GinkgoHelper()
	if err != nil && isUnsupported(err) {
		Skip(fmt.Sprintf("%s does not implement this op: %v", s.Backend, err))
	}
}

// Input is rank r's element i for a spec. Every rank's data differs from
// every other rank's at any world size up to 8, so that a wrong root or
// two swapped blocks change a result: the integer formulas differ at every
// position, and the two-valued ones (bool, float8, PRODUCT) spell r in
// binary over any three consecutive positions (bit i%3 of r). The values
// are small integers, so that they and every reduction of up to 8 ranks
// are exact in every dtype: float8 e5m2 holds the integers up to 8 exactly
// (so its values are 0 and 1, and PREMUL_SUM's doubled sums stay even
// integers up to 16); a product has at most 4 factors of 2; sums stay
// within 8 × 7, doubled 112, below int8's 127.
func Input(dt tensor.DType, op backend.RedOpType, r, i int) float64 {
	bit := float64(r >> (i % 3) & 1)
	switch {
	case dt == tensor.Bool || dt == tensor.Float8E5M2 || dt == tensor.Float8E4M3:
		return bit
	case op == backend.Product:
		return 1 + bit
	case op == backend.BAnd || op == backend.BOr || op == backend.BXor:
		return float64((r*5 + i*3) % 8) // 5 is odd: a permutation of the ranks mod 8
	case dt == tensor.Uint8:
		return float64((r + i) % 8)
	default:
		return float64((r+i)%8 - i%2) // negatives too
	}
}

// Reference computes the expected reduction of vals[rank][i] as the op's
// definition says, for dtype dt.
func Reference(dt tensor.DType, op backend.ReduceOp, vals [][]float64) []float64 {
	n := len(vals)
	out := make([]float64, len(vals[0]))
	for i := range out {
		col := make([]float64, n)
		for r := range n {
			col[r] = vals[r][i]
		}
		out[i] = reduceCol(dt, op, col)
	}
	return out
}

func reduceCol(dt tensor.DType, op backend.ReduceOp, col []float64) float64 {
	if dt == tensor.Bool {
		any, all, odd := false, true, false
		for _, v := range col {
			b := v != 0
			any, all, odd = any || b, all && b, odd != b
		}
		switch op.Type {
		case backend.Product, backend.Min, backend.BAnd:
			return b2f(all)
		case backend.BXor:
			return b2f(odd)
		case backend.PreMulSum:
			return b2f(any && op.Factor != 0)
		}
		return b2f(any)
	}
	acc := col[0]
	integer := dt.IsInteger()
	pre := func(v float64) float64 {
		if op.Type != backend.PreMulSum {
			return v
		}
		if integer {
			return math.Trunc(v * op.Factor)
		}
		return v * op.Factor
	}
	acc = pre(acc)
	for _, v := range col[1:] {
		v = pre(v)
		switch op.Type {
		case backend.Sum, backend.Avg, backend.PreMulSum:
			acc += v
		case backend.Product:
			acc *= v
		case backend.Min:
			acc = math.Min(acc, v)
		case backend.Max:
			acc = math.Max(acc, v)
		case backend.BAnd:
			acc = float64(int64(acc) & int64(v))
		case backend.BOr:
			acc = float64(int64(acc) | int64(v))
		case backend.BXor:
			acc = float64(int64(acc) ^ int64(v))
		}
	}
	if op.Type == backend.Avg {
		acc /= float64(len(col))
		if integer {
			acc = math.Trunc(acc)
		}
	}
	return acc
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// tolerance is the relative error allowed for dt: zero for integers; for
// floats, enough for one rounding of a division (AVG), which a backend may
// do in a wider type before it rounds to dt.
func tolerance(dt tensor.DType) float64 {
	switch dt {
	case tensor.Float64:
		return 1e-12
	case tensor.Float32:
		return 1e-6
	case tensor.Float16:
		return 1e-3
	case tensor.BFloat16:
		return 8e-3
	case tensor.Float8E4M3, tensor.Float8E5M2:
		return 0.13
	}
	return 0
}

// ExpectValues compares got with want rounded to dt, within dt's tolerance.
func ExpectValues(dt tensor.DType, got, want []float64, what string) {
	GinkgoHelper()
	Expect(got).To(HaveLen(len(want)), what)
	rounded, err := tensor.FromFloat64s(dt, want)
	Expect(err).NotTo(HaveOccurred())
	w, _ := rounded.Float64s()
	tol := tolerance(dt)
	for i := range w {
		if tol == 0 {
			if got[i] != w[i] {
				Fail(fmt.Sprintf("%s: element %d of %s is %v, want %v (got %v, want %v)", what, i, dt, got[i], w[i], got, w))
			}
			continue
		}
		if math.Abs(got[i]-w[i]) > tol*math.Max(1, math.Abs(w[i])) {
			Fail(fmt.Sprintf("%s: element %d of %s is %v, want %v within %g (got %v, want %v)", what, i, dt, got[i], w[i], tol, got, w))
		}
	}
}

// ReduceOps are the reduce ops a spec runs for dt: the bitwise ones only
// on integers and bool, PREMUL_SUM with factor 2.
func ReduceOps(dt tensor.DType) []backend.ReduceOp {
	ops := []backend.ReduceOp{backend.SUM, backend.AVG, backend.PRODUCT, backend.MIN, backend.MAX, backend.PremulSum(2)}
	if dt.IsInteger() {
		ops = append(ops, backend.BAND, backend.BOR, backend.BXOR)
	}
	return ops
}
