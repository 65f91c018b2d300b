package ucc

import (
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/reduceop"
	"github.com/gocoll/gocoll/tensor"
)

// TestWholeReds checks allreduceOne's table against uccReduction for every
// dtype and reduce op type: an entry exactly where UCC reduces the pair
// whole (a valid pair, not AVG or PREMUL_SUM, not widened), with
// uccReduction's datatype, op and element size.
func TestWholeReds(t *testing.T) {
	b := &Backend{reds: newWholeReds()}
	n := 0
	for _, dt := range tensor.DTypes() {
		for o := range numReduceTypes + 1 { // one type past the table's end
			op := backend.ReduceOp{Type: reduceop.Type(o)}
			got, ok := b.wholeRed(dt, op.Type)
			r, err := uccReduction(dt, op)
			want := o < numReduceTypes && op.ValidFor(dt) == nil && err == nil && r.ratio == 1 &&
				op.Type != backend.Avg && op.Type != backend.PreMulSum
			if ok != want {
				t.Errorf("%s %s: in the table %v, want %v", dt, op.Type, ok, want)
				continue
			}
			if !ok {
				continue
			}
			n++
			if got.dt != r.dt || got.op != r.op || got.elemLen != r.elemLen || got.ratio != 1 {
				t.Errorf("%s %s: table (dt %d, op %d, %d B) against uccReduction (dt %d, op %d, %d B)", dt, op.Type,
					got.dt, got.op, got.elemLen, r.dt, r.op, r.elemLen)
			}
		}
	}
	if _, ok := b.wholeRed(tensor.Float32, backend.Sum); !ok || n < 20 {
		t.Fatalf("the table holds %d pairs, float32 SUM in it: %v", n, ok)
	}
	if _, ok := b.wholeRed(tensor.Float16, backend.Sum); ok {
		t.Fatal("float16 SUM is widened to float32, not whole")
	}
}
