package coll

import "testing"

// TestPlanRDPairs: in every world size, each exchange of recursive
// doubling is mutual (r's peer at a step has r as its peer there), every
// folded-away even rank hands over to the next odd one, and exactly a
// power of two of ranks take part.
func TestPlanRDPairs(t *testing.T) {
	for n := 1; n <= 17; n++ {
		taking := 0
		for r := range n {
			d := planRD(n, r)
			if d.newrank < 0 {
				if !d.folded() || r%2 != 0 || r+1 >= n || planRD(n, r+1).newrank < 0 {
					t.Fatalf("n=%d r=%d: sits out without a folded odd partner: %+v", n, r, d)
				}
				continue
			}
			taking++
			for mask := 1; mask < d.p; mask <<= 1 {
				q := d.peer(mask)
				if q < 0 || q >= n || q == r {
					t.Fatalf("n=%d r=%d mask=%d: peer %d", n, r, mask, q)
				}
				if back := planRD(n, q).peer(mask); back != r {
					t.Fatalf("n=%d r=%d mask=%d: peer %d pairs with %d", n, r, mask, q, back)
				}
			}
		}
		if p := planRD(n, 0).p; taking != p || p&(p-1) != 0 {
			t.Fatalf("n=%d: %d ranks exchange, plan p=%d", n, taking, p)
		}
	}
}
