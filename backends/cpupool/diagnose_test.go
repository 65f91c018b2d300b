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
