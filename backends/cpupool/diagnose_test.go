package cpupool_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// TestTimeoutDiagnosisBounded: a collective that times out while the
// store's desync report hangs (a store across a cut link: here it blocks
// until the test ends, whatever its context says; DumpAll returns at once,
// as the dispatcher's does without the store)
// still fails soon after its timeout, with ErrTimeout naming the rank that
// never issued it (from the peers' answers). The bound is generous: it
// fails only an error that waits for the store.
func TestTimeoutDiagnosisBounded(t *testing.T) {
	release := make(chan struct{})
	st := store.NewHashStore()
	bs := make([]backend.Backend, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range bs {
		wg.Go(func() {
			bs[r], errs[r] = cpupool.New(context.Background(), backend.Config{Store: st, Rank: r, WorldSize: 2, Timeout: 20 * time.Second,
				Desync: func(context.Context, backend.Op, uint64) ([]int, string) {
					<-release
					return nil, "too late"
				},
				DumpAll: func(string) string { return "/tmp/fr_test" }})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(release)
		for _, b := range bs {
			_ = b.Abort(context.Background(), errors.New("test over"))
			_ = b.Close(context.Background())
		}
	})
	const timeout = 300 * time.Millisecond
	start := time.Now()
	w, err := bs[0].Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 1, Timeout: timeout},
		[]*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{}) // rank 1 never joins
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.WaitHost(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(timeout + cpupool.DiagnosisBudget + 10*time.Second):
		t.Fatal("the timed-out op waits for its diagnosis")
	}
	var oe *backend.OpError
	if !errors.Is(err, backend.ErrTimeout) || !errors.As(err, &oe) || !slices.Equal(oe.Ranks, []int{1}) ||
		!strings.Contains(err.Error(), "desync report unavailable") {
		t.Fatalf("got %v; want ErrTimeout naming rank 1, without the desync report", err)
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestProbeBusy: a rank's answer to a probe says how many collectives it
// issued and whether one is still in flight, small (the deferred ring) or
// large (a queued job), until its peers join and it ends, waited for or not.
func TestProbeBusy(t *testing.T) {
	bs := group(t, 2, nil)
	ctx := context.Background()
	for i, n := range []int{4, 1 << 20} {
		tag := uint64(i + 1)
		meta := backend.Meta{Op: backend.OpAllreduce, Seq: tag, Timeout: 10 * time.Second}
		w0, err := bs[0].Allreduce(ctx, meta, []*tensor.Tensor{tensor.New(tensor.Float32, n)}, backend.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if issued, busy := cpupool.Probe(bs[0]); issued != tag || !busy {
			t.Fatalf("%d floats: rank 0 waits for rank 1: probe says issued %d busy %v, want %d true", n, issued, busy, tag)
		}
		if issued, busy := cpupool.Probe(bs[1]); issued != tag-1 || busy {
			t.Fatalf("%d floats: rank 1 has not issued it: probe says issued %d busy %v, want %d false", n, issued, busy, tag-1)
		}
		w1, err := bs[1].Allreduce(ctx, meta, []*tensor.Tensor{tensor.New(tensor.Float32, n)}, backend.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(w0.WaitHost(ctx), w1.WaitHost(ctx)); err != nil {
			t.Fatal(err)
		}
		for r, b := range bs {
			if issued, busy := cpupool.Probe(b); issued != tag || busy {
				t.Fatalf("%d floats: rank %d after the op: probe says issued %d busy %v, want %d false", n, r, issued, busy, tag)
			}
		}
	}
}
