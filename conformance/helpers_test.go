package conformance

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// minCount is the fewest elements over which every rank's input differs
// from every other's: the two-valued formulas spell the rank over three
// positions.
const minCount = 3

// inputRows is Input for n ranks, count elements from position salt, each
// value rounded to dt.
func inputRows(t *testing.T, dt tensor.DType, op backend.RedOpType, n, count, salt int) [][]float64 {
	t.Helper()
	rows := make([][]float64, n)
	for r := range rows {
		v := make([]float64, count)
		for i := range v {
			v[i] = Input(dt, op, r, i+salt)
		}
		rows[r] = roundTo(t, dt, v)
		if !slices.Equal(rows[r], v) {
			t.Fatalf("%s %s: rank %d's input %v is not exact in %s (rounds to %v)", dt, op, r, v, dt, rows[r])
		}
	}
	return rows
}

func roundTo(t *testing.T, dt tensor.DType, v []float64) []float64 {
	t.Helper()
	h, err := tensor.FromFloat64s(dt, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// opTypes are the op types a spec passes to Input for dt: SUM for the data
// movement specs, and every reduce op of ReduceOps.
func opTypes(dt tensor.DType) []backend.ReduceOp {
	return append([]backend.ReduceOp{backend.SUM}, ReduceOps(dt)...)
}

// TestInputsDifferPairwise: at every world size up to 8, for every dtype
// and reduce op, no two ranks hold the same data, wherever a spec starts
// (salt) and however many elements it takes (from minCount on); so a
// broadcast from the wrong root, or two swapped allgather blocks, changes
// what a spec reads.
func TestInputsDifferPairwise(t *testing.T) {
	for _, dt := range tensor.DTypes() {
		for _, op := range opTypes(dt) {
			for n := 1; n <= 8; n++ {
				for salt := range 80 {
					for _, count := range []int{minCount, 7} {
						rows := inputRows(t, dt, op.Type, n, count, salt)
						for a := range n {
							for b := a + 1; b < n; b++ {
								if slices.Equal(rows[a], rows[b]) {
									t.Fatalf("%s %s, %d ranks, %d elements from %d: ranks %d and %d both hold %v", dt, op, n, count, salt, a, b, rows[a])
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestInputsDifferEverywhereForIntegers: the integer formulas (not bool,
// float8 or PRODUCT) give every rank a different value at every position,
// so even one-element specs tell the ranks apart.
func TestInputsDifferEverywhereForIntegers(t *testing.T) {
	for _, dt := range tensor.DTypes() {
		if dt == tensor.Bool || dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2 {
			continue
		}
		for _, op := range opTypes(dt) {
			if op.Type == backend.Product {
				continue
			}
			for i := range 80 {
				seen := map[float64]int{}
				for r := range 8 {
					v := Input(dt, op.Type, r, i)
					if p, dup := seen[v]; dup {
						t.Fatalf("%s %s position %d: ranks %d and %d both hold %v", dt, op, i, p, r, v)
					}
					seen[v] = r
				}
			}
		}
	}
}

// TestReferencesExact: every reduction of the inputs that specs check
// exactly (all but AVG, which divides) is itself exact in the dtype, at
// every world size up to 8, so a spec's expected value is not a rounding
// of what the backend must produce.
func TestReferencesExact(t *testing.T) {
	for _, dt := range tensor.DTypes() {
		for _, op := range ReduceOps(dt) {
			if op.Type == backend.Avg {
				continue
			}
			for n := 1; n <= 8; n++ {
				t.Run(fmt.Sprintf("%s/%s/%d", dt, op, n), func(t *testing.T) {
					rows := inputRows(t, dt, op.Type, n, 12, 0)
					want := Reference(dt, op, rows)
					if got := roundTo(t, dt, want); !slices.Equal(got, want) {
						t.Fatalf("the reference %v is not exact in %s (rounds to %v)", want, dt, got)
					}
					if dt.IsInteger() && dt != tensor.Bool {
						lo, hi := intRange(dt)
						for _, v := range want {
							if v < lo || v > hi {
								t.Fatalf("the reference %v leaves %s's range [%v, %v]", want, dt, lo, hi)
							}
						}
					}
				})
			}
		}
	}
}

func intRange(dt tensor.DType) (lo, hi float64) {
	switch dt {
	case tensor.Int8:
		return -128, 127
	case tensor.Uint8:
		return 0, 255
	case tensor.Int32:
		return -1 << 31, 1<<31 - 1
	}
	return -1 << 63, 1<<63 - 1
}
