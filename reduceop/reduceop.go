// Package reduceop holds ReduceOp, the reduction a collective applies, in a
// leaf package: the contract (package backend), the dispatcher and the
// reduction kernels (internal/reduce) all name it, and none of them should
// have to import the others, or cgo, to do so. Package backend re-exports
// these names, so applications keep writing backend.SUM.
package reduceop

import (
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/tensor"
)

// Type is the kind of a reduction. The values are PyTorch's
// ReduceOp::Type, so SUM is the zero value and PREMUL_SUM is 8.
type Type uint8

// The reduction kinds.
const (
	Sum Type = iota
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
func (t Type) String() string {
	if int(t) < len(redOpNames) {
		return redOpNames[t]
	}
	return fmt.Sprintf("RedOpType(%d)", uint8(t))
}

// ReduceOp is a reduction: a kind and, for PREMUL_SUM, the factor each input
// is multiplied by before the sum. The zero value is SUM. ReduceOp is a
// comparable value type.
type ReduceOp struct {
	Type   Type
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

// ErrInvalid is wrapped by the errors of ValidFor. Package backend's
// ErrInvalidArgument is the same value, so errors.Is works with either.
var ErrInvalid = errors.New("invalid argument")

// ValidFor returns an error wrapping ErrInvalid when r cannot apply
// to dt: bitwise ops need an integer or bool type, and every op needs a
// known kind.
func (r ReduceOp) ValidFor(dt tensor.DType) error {
	if int(r.Type) >= len(redOpNames) {
		return fmt.Errorf("%w: unknown reduce op %v", ErrInvalid, r.Type)
	}
	if r.Bitwise() && !dt.IsInteger() {
		return fmt.Errorf("%w: Cannot use ReduceOp.%v with dtype %v (bitwise ops need an integer or bool type)", ErrInvalid, r.Type, dt)
	}
	return nil
}
