package coll

import (
	"math/bits"
)

// lowbit returns the lowest set bit of v, or the power of two at or above
// n for v == 0 (the root's subtree is everything).
func lowbit(v, n int) int {
	if v == 0 {
		return 1 << bits.Len(uint(n-1))
	}
	return v & -v
}
