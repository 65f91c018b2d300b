package ucc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// flowRankEnv makes the test binary one rank of TestBoardFlowControl
// ("RANK:STOREFILE"): UCC's contexts of two ranks in one process did not
// wire up reliably (the out-of-band allgather of one timed out), so each
// rank is a process, as in conformance.
const flowRankEnv = "GOCOLL_UCC_TEST_FLOW_RANK"

// TestBoardFlowControl: rank 0 issues more allreduces than the board's
// ring holds before its peer issues any. The first fpSlots publish at
// issue; the rest wait in the queue unpublished (the peer has checked
// nothing, so there is no room) and go on the board in order as room
// comes; every op completes with the right sum once the peer issues its
// own. It fails if a number is published out of order or twice (wrong
// sums, or a hang to the deadline) or if the ring's limit is not kept.
func TestBoardFlowControl(t *testing.T) {
	if v := os.Getenv(flowRankEnv); v != "" {
		r, path, _ := strings.Cut(v, ":")
		rank, err := strconv.Atoi(r)
		if err != nil {
			t.Fatalf("%s=%q", flowRankEnv, v)
		}
		flowRank(t, rank, path)
		return
	}
	if err := Load(); err != nil {
		t.Skipf("libucc cannot be loaded here (%v); the ucc conformance run in the sid root covers the backend", err)
	}
	path := filepath.Join(t.TempDir(), "store")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	for r := range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestBoardFlowControl$", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s", flowRankEnv, r, path))
		wg.Go(func() { outs[r], errs[r] = cmd.CombinedOutput() })
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil || !strings.Contains(string(outs[r]), "--- PASS: TestBoardFlowControl") {
			t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r])
		}
	}
}

// flowRank is one rank of TestBoardFlowControl.
func flowRank(t *testing.T, rank int, path string) {
	st, err := store.NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	be, err := New(ctx, backend.Config{Store: st, Rank: rank, WorldSize: 2, GroupName: "0", GroupDesc: "flow-test",
		Timeout: time.Minute, Options: &Options{Fingerprints: FingerprintsShm}})
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = b.Close(cctx)
	}()
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
