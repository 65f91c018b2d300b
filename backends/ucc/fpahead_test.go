package ucc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// aheadRankEnv makes the test binary one rank of TestFingerprintsAhead
// ("RANK:STOREFILE"; inRankProcesses).
const aheadRankEnv = "GOCOLL_UCC_TEST_AHEAD_RANK"

// TestFingerprintsAhead: two ranks run a loop of one allreduce; from the
// second op on, each rank posts it ahead of the check (its fingerprint is
// the last agreed op's), and every sum is right. Then rank 0 posts one
// more of the same ahead while rank 1 passes fewer elements: both fail
// with ErrInvalidArgument naming both sizes, rank 1 having put rank 0's
// collective into UCC over scratch memory (a stand-in), and the next op
// of both ranks completes with the right sum. Once at 256 elements
// (UCC's small-message algorithm) and once at 1 Mi (4 MiB: the large
// one, where 1 Mi - 1024 would run another algorithm and hang the group
// if UCC saw it). It fails if no op went ahead, if a mismatch is not
// named on both ranks, if the stand-in is not posted, or if the group
// does not work on (a wrong sum, or a hang to the deadline).
func TestFingerprintsAhead(t *testing.T) {
	inRankProcesses(t, "TestFingerprintsAhead", aheadRankEnv, aheadRank)
}

// aheadRank is one rank of TestFingerprintsAhead.
func aheadRank(t *testing.T, rank int, path string) {
	_, b := rankBackend(t, rank, path, "ahead-test", 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	seq := uint64(0)
	// op allreduces n elements of rank+1 and returns the first element
	// of the result.
	op := func(n int) (float64, error) {
		seq++
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(rank + 1)
		}
		x, err := tensor.FromFloat64s(tensor.Float32, v)
		if err != nil {
			t.Fatal(err)
		}
		w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: seq}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err == nil {
			err = w.Wait(ctx)
		}
		if err != nil {
			return 0, err
		}
		got, err := x.Float64s()
		if err != nil {
			t.Fatal(err)
		}
		return got[n-1], nil
	}
	counts := func() (ahead, standIn uint64) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.fp.nAhead, b.fp.nStandIn
	}
	for _, n := range []int{256, 1 << 20} {
		a0, s0 := counts()
		const loop = 20
		for i := range loop {
			got, err := op(n)
			if err != nil || got != 3 {
				t.Fatalf("%d elements, op %d of the loop: %v, %v (want 3)", n, i+1, got, err)
			}
		}
		if a, _ := counts(); a-a0 < loop-1 {
			t.Fatalf("%d elements: %d of the loop's %d ops went ahead, want at least %d", n, a-a0, loop, loop-1)
		}
		m := n
		if rank == 1 {
			m = n - n/8
		}
		_, err := op(m)
		want := fmt.Sprintf("rank 0 allreduce float32 x %d (SUM), rank 1 allreduce float32 x %d (SUM)", n, n-n/8)
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrInvalidArgument) || !errors.As(err, &oe) || !strings.Contains(oe.Detail, want) ||
			fmt.Sprint(oe.Ranks) != "[0 1]" {
			t.Fatalf("%d elements against %d: %v; want ErrInvalidArgument naming ranks [0 1] and %q", n, n-n/8, err, want)
		}
		a, s := counts()
		if rank == 0 && a-a0 != loop {
			t.Fatalf("%d elements: rank 0 posted %d ops ahead with the mismatched one, want %d", n, a-a0, loop)
		}
		if rank == 1 && s-s0 != 1 {
			t.Fatalf("%d elements: rank 1 posted %d stand-ins, want 1", n, s-s0)
		}
		for i := range 2 {
			got, err := op(n)
			if err != nil || got != 3 {
				t.Fatalf("%d elements, op %d after the mismatch: %v, %v (want 3)", n, i+1, got, err)
			}
		}
	}
}
