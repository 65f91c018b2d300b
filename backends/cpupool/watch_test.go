package cpupool_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// pair starts two cpupool backends whose DumpAll counts its calls.
func pair(t *testing.T) ([]backend.Backend, *atomic.Int32) {
	t.Helper()
	st := store.NewHashStore()
	var dumps atomic.Int32
	bs := make([]backend.Backend, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			bs[r], errs[r] = cpupool.New(context.Background(), backend.Config{Store: st, Rank: r, WorldSize: 2, Timeout: 20 * time.Second,
				DumpAll: func(string) string { dumps.Add(1); return "/tmp/fr_test" }})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, b := range bs {
			_ = b.Abort(context.Background(), errors.New("test over"))
			_ = b.Close(context.Background())
		}
	})
	return bs, &dumps
}

// A timeout goes through the watch unit: the first one dumps (and names the
// file), the next does not.
func TestTimeoutDumpsOnce(t *testing.T) {
	bs, dumps := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds the test
	defer cancel()
	var errs []error
	for seq := uint64(1); seq <= 2; seq++ { // rank 1 never joins
		w, err := bs[0].Allreduce(ctx, backend.Meta{Op: backend.OpAllreduce, Seq: seq, Timeout: 300 * time.Millisecond},
			[]*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		errs = append(errs, w.WaitHost(ctx))
	}
	if ctx.Err() != nil {
		t.Fatal("the timeouts did not fire")
	}
	for i, err := range errs {
		if !errors.Is(err, backend.ErrTimeout) {
			t.Fatalf("op %d: %v", i+1, err)
		}
	}
	if !strings.Contains(errs[0].Error(), "flight recorder dump: /tmp/fr_test") || strings.Contains(errs[1].Error(), "flight recorder dump") {
		t.Fatalf("want the dump named by the first timeout only:\n%v\n%v", errs[0], errs[1])
	}
	if n := dumps.Load(); n != 1 {
		t.Fatalf("%d dumps, want 1", n)
	}
}

// A caller's deadline that fires before the op's timeout says so, and
// still wraps ErrTimeout and the context's error.
func TestWaitHostNamesTheCallersDeadline(t *testing.T) {
	bs, dumps := pair(t)
	w, err := bs[0].Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 4, Timeout: 5 * time.Second},
		[]*tensor.Tensor{tensor.New(tensor.Float32, 4)}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = w.WaitHost(ctx)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if !strings.HasPrefix(msg, "wait for cpupool allreduce seq 4 on rank 0: caller's context deadline exceeded after 3") ||
		!strings.HasSuffix(msg, "ms (op timeout 5s not reached)") {
		t.Fatalf("got %q", msg)
	}
	var we *backend.WaitError
	if !errors.Is(err, backend.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &we) || we.Waited < 300*time.Millisecond {
		t.Fatalf("%v: want a *backend.WaitError wrapping ErrTimeout and the deadline", err)
	}
	if w.IsCompleted() || dumps.Load() != 0 {
		t.Fatal("the caller's deadline failed the op")
	}
}
