package coll

import (
	"math/bits"
)

// The binomial trees (broadcast, reduce, gather, scatter) number ranks
// relative to the root, vr = (r - root) mod n. Rank vr's parent is vr with
// its lowest set bit cleared, and its children are vr + m for the powers
// of two m below that bit, so the root reaches n ranks in ceil(log2 n)
// rounds and every rank but the root has exactly one parent.

// lowbit returns the lowest set bit of v, or the power of two at or above
// n for v == 0 (the root's subtree is everything).
func lowbit(v, n int) int {
	if v == 0 {
		return 1 << bits.Len(uint(n-1))
	}
	return v & -v
}
