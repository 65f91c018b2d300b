package backend

import (
	"fmt"

	"github.com/gocoll/gocoll/tensor"
)

// RedOpType is the kind of a reduction. The values are PyTorch's
// ReduceOp::RedOpType, so SUM is the zero value and PREMUL_SUM is 8.
type RedOpType uint8

// The reduction kinds.
const (
	Sum RedOpType = iota
	Avg
	Product
	Min
	Max
	BAnd
	BOr
	BXor
	PreMulSum
)

var redOpNames = [...]string{"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"}

// String returns PyTorch's name, e.g. "PREMUL_SUM".
func (t RedOpType) String() string {
	if int(t) < len(redOpNames) {
		return redOpNames[t]
	}
	return fmt.Sprintf("RedOpType(%d)", uint8(t))
}

// ReduceOp is a reduction: a kind and, for PREMUL_SUM, the factor each input
// is multiplied by before the sum. The zero value is SUM. ReduceOp is a
// comparable value type.
type ReduceOp struct {
	Type   RedOpType
	Factor float64 // only for PreMulSum
}

// The plain reductions, as values.
var (
	SUM     = ReduceOp{Type: Sum}
	AVG     = ReduceOp{Type: Avg}
	PRODUCT = ReduceOp{Type: Product}
	MIN     = ReduceOp{Type: Min}
	MAX     = ReduceOp{Type: Max}
	BAND    = ReduceOp{Type: BAnd}
	BOR     = ReduceOp{Type: BOr}
	BXOR    = ReduceOp{Type: BXor}
)

// PremulSum returns PREMUL_SUM with factor f: the result is sum(f * x_i).
func PremulSum(f float64) ReduceOp { return ReduceOp{Type: PreMulSum, Factor: f} }

// String returns e.g. "SUM" or "PREMUL_SUM(0.5)".
func (r ReduceOp) String() string {
	if r.Type == PreMulSum {
		return fmt.Sprintf("PREMUL_SUM(%g)", r.Factor)
	}
	return r.Type.String()
}

// Bitwise reports whether r is BAND, BOR or BXOR.
func (r ReduceOp) Bitwise() bool { return r.Type == BAnd || r.Type == BOr || r.Type == BXor }

// ValidFor returns an error wrapping ErrInvalidArgument when r cannot apply
// to dt: bitwise ops need an integer or bool type, and every op needs a
// known kind.
func (r ReduceOp) ValidFor(dt tensor.DType) error {
	if int(r.Type) >= len(redOpNames) {
		return fmt.Errorf("%w: unknown reduce op %v", ErrInvalidArgument, r.Type)
	}
	if r.Bitwise() && !dt.IsInteger() {
		return fmt.Errorf("%w: Cannot use ReduceOp.%v with dtype %v (bitwise ops need an integer or bool type)", ErrInvalidArgument, r.Type, dt)
	}
	return nil
}
