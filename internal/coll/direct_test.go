package coll

import "testing"

// TestDirectStep checks the chunking of a direct allreduce's blocks: whole
// elements, no smaller than directChunk (directChunkPair at 2 ranks), and
// never more than directChunks chunks a block (the notices of a block
// must fit in the lanes).
func TestDirectStep(t *testing.T) {
	for _, ranks := range []int{2, 3, 8} {
		least := directChunk
		if ranks == 2 {
			least = directChunkPair
		}
		for _, elem := range []int{1, 2, 4, 8} {
			for _, n := range []int{0, 1, 7, least - 3, least, 5 << 20, least * directChunks, least*directChunks + 1, 1<<30 + 12345} {
				n -= n % elem
				step := directStep(n, elem, ranks)
				if step%elem != 0 || step < least {
					t.Errorf("directStep(%d, %d, %d) = %d: not a multiple of the element, or under %d", n, elem, ranks, step, least)
				}
				if chunks := (n + step - 1) / step; chunks > directChunks {
					t.Errorf("directStep(%d, %d, %d) = %d: %d chunks, more than %d", n, elem, ranks, step, chunks, directChunks)
				}
			}
		}
	}
}

// TestLaneStep checks the chunking of lane allreduces: one message up to
// laneWhole, else even chunks of whole elements, none over LaneChunk by
// an element or more, that cover the buffer.
func TestLaneStep(t *testing.T) {
	for _, elem := range []int{1, 2, 4, 8} {
		for _, n := range []int{1, 8, 256 << 10, laneWhole, laneWhole + 8, 1 << 20, 2<<20 + 24, 64 << 20} {
			if n -= n % elem; n == 0 {
				continue // AllreduceLanes sends nothing
			}
			step := laneStep(n, elem)
			switch {
			case n <= laneWhole && step != n:
				t.Errorf("laneStep(%d, %d) = %d, want one message", n, elem, step)
			case n > laneWhole && (step%elem != 0 || step >= LaneChunk+elem || step*((n+step-1)/step) < n):
				t.Errorf("laneStep(%d, %d) = %d: not whole elements, over %d, or short", n, elem, step, LaneChunk)
			}
		}
	}
}
