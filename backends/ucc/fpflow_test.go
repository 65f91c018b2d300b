package ucc

import (
	"context"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// flowRankEnv makes the test binary one rank of TestBoardFlowControl
// ("RANK:STOREFILE"; inRankProcesses says why a process per rank).
const flowRankEnv = "GOCOLL_UCC_TEST_FLOW_RANK"

// TestBoardFlowControl: rank 0 issues more allreduces than the board's
// ring holds before its peer issues any. The first fpSlots publish at
// issue; the rest wait in the queue unpublished (the peer has checked
// nothing, so there is no room) and go on the board in order as room
// comes; every op completes with the right sum once the peer issues its
// own. It fails if a number is published out of order or twice (wrong
// sums, or a hang to the deadline) or if the ring's limit is not kept.
func TestBoardFlowControl(t *testing.T) {
	inRankProcesses(t, "TestBoardFlowControl", flowRankEnv, flowRank)
}

// flowRank is one rank of TestBoardFlowControl.
func flowRank(t *testing.T, rank int, path string) {
	st, b := rankBackend(t, rank, path, "flow-test", time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = fpSlots + 88
	if rank == 1 {
		// Rank 1 issues once rank 0 has issued all of its ops.
		if _, err := st.Get(ctx, "rank0-issued"); err != nil {
			t.Fatal(err)
		}
	}
	var xs []*tensor.Tensor
	var ws []backend.Work
	for i := range n {
		x, err := tensor.FromFloat64s(tensor.Float32, []float64{float64((i + 1) * (1 + 9*rank)), 1})
		if err != nil {
			t.Fatal(err)
		}
		w, err := b.Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: uint64(i + 1)}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			t.Fatalf("op %d: %v", i+1, err)
		}
		xs, ws = append(xs, x), append(ws, w)
	}
	if rank == 0 {
		b.mu.Lock()
		g := b.fp
		queued, pub, next := len(g.q), g.pub, g.next
		b.mu.Unlock()
		if queued != n || pub != fpSlots || next != n {
			t.Fatalf("before the peer issued: %d in the queue, %d published of %d; want %d, %d of %d", queued, pub, next, n, fpSlots, n)
		}
		if err := st.Set(ctx, "rank0-issued", []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range ws {
		if err := w.Wait(ctx); err != nil {
			t.Fatalf("op %d: %v", i+1, err)
		}
		got, err := xs[i].Float64s()
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(11 * (i + 1)); got[0] != want || got[1] != 2 {
			t.Fatalf("op %d: %v, want [%v 2]", i+1, got, want)
		}
	}
}
