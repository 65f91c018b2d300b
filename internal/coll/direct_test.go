package coll

import "testing"

// TestDirectStep checks the chunking of a direct allreduce's blocks: whole
// elements, no smaller than directChunk, and never more than directChunks
// chunks a block (the notices of a block must fit in the lanes).
func TestDirectStep(t *testing.T) {
	for _, elem := range []int{1, 2, 4, 8} {
		for _, n := range []int{0, 1, 7, directChunk - 3, directChunk, 5 << 20, directChunk * directChunks, directChunk*directChunks + 1, 1<<30 + 12345} {
			n -= n % elem
			step := directStep(n, elem)
			if step%elem != 0 || step < directChunk {
				t.Errorf("directStep(%d, %d) = %d: not a multiple of the element, or under %d", n, elem, step, directChunk)
			}
			if chunks := (n + step - 1) / step; chunks > directChunks {
				t.Errorf("directStep(%d, %d) = %d: %d chunks, more than %d", n, elem, step, chunks, directChunks)
			}
		}
	}
}
