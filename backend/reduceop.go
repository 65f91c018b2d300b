package backend

import "github.com/gocoll/gocoll/reduceop"

// RedOpType is the kind of a reduction; see reduceop.Type.
type RedOpType = reduceop.Type

// ReduceOp is a reduction: a kind and, for PREMUL_SUM, its factor; see
// reduceop.ReduceOp. The zero value is SUM.
type ReduceOp = reduceop.ReduceOp

// The reduction kinds, re-exported from package reduceop.
const (
	Sum       = reduceop.Sum
	Avg       = reduceop.Avg
	Product   = reduceop.Product
	Min       = reduceop.Min
	Max       = reduceop.Max
	BAnd      = reduceop.BAnd
	BOr       = reduceop.BOr
	BXor      = reduceop.BXor
	PreMulSum = reduceop.PreMulSum
)

// The plain reductions, as values, re-exported from package reduceop.
var (
	SUM     = reduceop.SUM
	AVG     = reduceop.AVG
	PRODUCT = reduceop.PRODUCT
	MIN     = reduceop.MIN
	MAX     = reduceop.MAX
	BAND    = reduceop.BAND
	BOR     = reduceop.BOR
	BXOR    = reduceop.BXOR
)

// PremulSum returns PREMUL_SUM with factor f: the result is sum(f * x_i).
func PremulSum(f float64) ReduceOp { return reduceop.PremulSum(f) }
