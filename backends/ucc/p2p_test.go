package ucc

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// These tests need no libucc: the monitored barrier runs over the store,
// and the p2p argument checks and the float widening come before UCC.

// fake is a backend of rank r of n on st with no UCC behind it.
func fake(st store.Store, r, n int) *Backend {
	return &Backend{cfg: backend.Config{Store: st, Rank: r, WorldSize: n}, args: hostChecker(r), stop: make(chan struct{})}
}

func TestMonitoredBarrierNamesLateRanks(t *testing.T) {
	st := store.NewHashStore()
	const n = 4
	m := backend.Meta{Op: backend.OpMonitoredBarrier, Seq: 7, Timeout: 300 * time.Millisecond}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n - 2 { // ranks 2 and 3 never come
		wg.Go(func() { errs[r] = fake(st, r, n).monitored(m, true) })
	}
	wg.Wait()
	var oe *backend.OpError
	if !errors.As(errs[0], &oe) || !errors.Is(errs[0], backend.ErrTimeout) {
		t.Fatalf("rank 0: %v, want an ErrTimeout OpError", errs[0])
	}
	if len(oe.Ranks) != 2 || oe.Ranks[0] != 2 || oe.Ranks[1] != 3 || !strings.Contains(errs[0].Error(), "Ranks 2, 3 failed to pass monitoredBarrier") {
		t.Fatalf("rank 0: ranks %v, %q", oe.Ranks, errs[0])
	}
	if !errors.Is(errs[1], backend.ErrRemote) || !strings.Contains(errs[1].Error(), "check rank 0 logs") {
		t.Fatalf("rank 1: %v, want ErrRemote pointing at rank 0", errs[1])
	}

	// Without WaitAllRanks, only the first late rank is named.
	m.Seq++
	wg.Go(func() { errs[0] = fake(st, 0, n).monitored(m, false) })
	for r := 1; r < n-1; r++ {
		wg.Go(func() { errs[r] = fake(st, r, n).monitored(m, false) })
	}
	wg.Wait()
	if !errors.As(errs[0], &oe) || len(oe.Ranks) != 1 || oe.Ranks[0] != 3 || !strings.Contains(errs[0].Error(), "Rank 3 failed to pass monitoredBarrier in 300 ms") {
		t.Fatalf("rank 0: %v", errs[0])
	}

	// All present: every rank passes.
	m.Seq++
	for r := range n {
		wg.Go(func() { errs[r] = fake(st, r, n).monitored(m, false) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestP2PArguments(t *testing.T) {
	b := fake(store.NewHashStore(), 1, 4)
	x := tensor.New(tensor.Float32, 3)
	m := backend.Meta{Op: backend.OpSend, Seq: 1}
	if _, err := b.Send(t.Context(), m, []*tensor.Tensor{x}, 1, backend.SendOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("send to self: %v", err)
	}
	if _, err := b.Recv(t.Context(), m, []*tensor.Tensor{x}, 4, backend.RecvOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("recv from rank 4 of 4: %v", err)
	}
	if _, err := b.Send(t.Context(), m, []*tensor.Tensor{x}, 0, backend.SendOptions{Tag: maxTag + 1}); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("tag past UCC's: %v", err)
	}
	if _, err := b.RecvAnysource(t.Context(), m, []*tensor.Tensor{x}, backend.RecvAnysourceOptions{}); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("recv_anysource: %v", err)
	}
}

// TestWideReduction checks that float16 and float8 reduce as float32 and
// round once: 2048 + 1 + 1 in float16 is 2050 rounded once, 2048 rounded
// at each step.
func TestWideReduction(t *testing.T) {
	b := fake(nil, 0, 2)
	for _, dt := range []tensor.DType{tensor.Float16, tensor.Float8E4M3, tensor.Float8E5M2} {
		r, err := b.args.Reduction(backend.OpAllreduce, backend.Meta{}, dt, backend.ReduceOp{Type: backend.Sum})
		if err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		if r.dt != predefined(11) || r.elemLen != 4 || r.ratio != 4/dt.Size() {
			t.Fatalf("%v: UCC dt %d, elemLen %d, ratio %d; want float32", dt, r.dt, r.elemLen, r.ratio)
		}
	}
	r, _ := b.args.Reduction(backend.OpAllreduce, backend.Meta{}, tensor.Float16, backend.ReduceOp{Type: backend.Sum})
	mk := func(v ...float64) []byte {
		x, err := tensor.FromFloat64s(tensor.Float16, v)
		if err != nil {
			t.Fatal(err)
		}
		return x.Bytes()
	}
	a, c1, c2 := r.in(mk(2048, -3.5)), r.in(mk(1, 0.25)), r.in(mk(1, 0.25))
	if len(a) != 8 {
		t.Fatalf("widened length %d, want 8", len(a))
	}
	r.k.Combine(a, c1)
	r.k.Combine(a, c2)
	dst := make([]byte, 4)
	r.back(dst, a)
	got, err := tensor.FromBytes(tensor.Float16, dst, 2)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := got.Float64s(); err != nil || v[0] != 2050 || v[1] != -3 {
		t.Fatalf("float16 sum %v, want [2050 -3]", v)
	}
	if _, err := b.args.Reduction(backend.OpAllreduce, backend.Meta{}, tensor.Float16, backend.ReduceOp{Type: backend.BAnd}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("BAND on float16: %v", err)
	}
}
