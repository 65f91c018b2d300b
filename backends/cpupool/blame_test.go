package cpupool

import (
	"slices"
	"testing"
)

// TestBlame: the ranks named for a collective that timed out are the
// silent ones and the idle ones short of it; those short of it but stuck
// in an earlier collective of their own only when nobody else is to blame.
func TestBlame(t *testing.T) {
	ok := func(issued uint64, busy bool) peerState { return peerState{answered: true, issued: issued, busy: busy} }
	silent := peerState{}
	for _, tc := range []struct {
		name   string
		tag    uint64
		states []peerState
		want   []int
	}{
		{"all joined", 5, []peerState{ok(5, true), ok(5, true), ok(6, true)}, nil},
		{"one idle behind", 5, []peerState{ok(5, true), ok(4, false), ok(5, true)}, []int{1}},
		{"one silent", 5, []peerState{ok(5, true), silent, ok(5, true)}, []int{1}},
		// The cut of TestTwoHosts: rank 2 finished seq 21 and issued 22,
		// rank 3 still waits in 21 for the far side, ranks 0 and 1.
		{"cut: neighbour stuck in the op before", 22, []peerState{silent, silent, ok(22, true), ok(21, true)}, []int{0, 1}},
		{"only blocked ones", 5, []peerState{ok(5, true), ok(4, true), ok(3, true)}, []int{1, 2}},
		{"idle beats blocked", 5, []peerState{ok(5, true), ok(4, true), ok(3, false)}, []int{2}},
	} {
		if got := blame(tc.tag, tc.states); !slices.Equal(got, tc.want) {
			t.Errorf("%s: blame(%d) = %v, want %v", tc.name, tc.tag, got, tc.want)
		}
	}
}
