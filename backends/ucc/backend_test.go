package ucc_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/ucc"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// group makes n ranks of the backend in this process, on one in-memory
// store; it skips when libucc cannot be loaded (the host of CI: the
// conformance run inside the Debian sid root is what proves the backend).
func group(t testing.TB, n int) []backend.Backend {
	t.Helper()
	if err := ucc.Load(); err != nil {
		t.Skipf("libucc cannot be loaded here (%v); the ucc conformance run in the sid root covers the backend", err)
	}
	st := store.NewHashStore()
	bs := make([]backend.Backend, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ps, _ := store.NewPrefixStore("g", st)
			bs[r], errs[r] = ucc.New(context.Background(), backend.Config{Store: ps, Rank: r, WorldSize: n, GroupName: "0", GroupDesc: "test", Timeout: time.Minute})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, b := range bs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = b.Close(ctx)
			cancel()
		}
	})
	return bs
}

func f32(t *testing.T, v ...float64) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromFloat64s(tensor.Float32, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func wait(t *testing.T, w backend.Work, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WaitHost(ctx); err != nil {
		t.Fatal(err)
	}
}

// The tests run one rank: UCC serialises context creation inside a
// process, so two ranks of one process deadlock in their out-of-band
// allgathers until ConnectTimeout. Several ranks are the conformance run's
// (scripts/ucc-conformance.sh, one process per rank).

func TestOneRank(t *testing.T) {
	b := group(t, 1)[0]
	x := f32(t, 1, 2, 3)
	done(t)(b.Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 1}, []*tensor.Tensor{x}, backend.AllreduceOptions{ReduceOp: backend.AVG}))
	if v, _ := x.Float64s(); v[0] != 1 || v[2] != 3 {
		t.Fatalf("allreduce AVG of one rank gave %v", v)
	}
	out := f32(t, 0, 0, 0)
	done(t)(b.AllgatherIntoTensor(context.Background(), backend.Meta{Op: backend.OpAllgatherIntoTensor, Seq: 2}, out, x, backend.AllgatherIntoTensorOptions{}))
	if v, _ := out.Float64s(); v[1] != 2 {
		t.Fatalf("allgather_into_tensor gave %v", v)
	}
	done(t)(b.Barrier(context.Background(), backend.Meta{Op: backend.OpBarrier, Seq: 3}, backend.BarrierOptions{}))
	// float16 reduces wide, in float32 through UCC, and rounds once: three
	// local tensors 2048 + 1 + 1 give 2050 (rounding at each step, 2048).
	hs := make([]*tensor.Tensor, 3)
	for i, v := range []float64{2048, 1, 1} {
		h, err := tensor.FromFloat64s(tensor.Float16, []float64{v, -v})
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	done(t)(b.Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 4}, hs, backend.AllreduceOptions{}))
	for i, h := range hs {
		if v, _ := h.Float64s(); v[0] != 2050 || v[1] != -2050 {
			t.Fatalf("float16 allreduce, tensor %d: %v, want [2050 -2050]", i, v)
		}
	}
	reason := errors.New("test abort")
	if err := b.Abort(context.Background(), reason); err != nil {
		t.Fatal(err)
	}
	_, err := b.Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 5}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if !errors.Is(err, backend.ErrAborted) || !errors.Is(err, reason) {
		t.Fatalf("op after Abort: want ErrAborted keeping the reason, got %v", err)
	}
}

// cpuTime is this process's user+system time, from /proc/self/stat.
func cpuTime(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc/self/stat")
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return time.Duration(u+s) * time.Second / 100 // USER_HZ
}

// TestIdleCPU: an idle group costs (almost) no CPU: the progress
// goroutine blocks when nothing is pending (ProcessGroupUCC holds a core).
func TestIdleCPU(t *testing.T) {
	b := group(t, 1)[0]
	done(t)(b.Allreduce(context.Background(), backend.Meta{Op: backend.OpAllreduce, Seq: 1}, []*tensor.Tensor{f32(t, 1)}, backend.AllreduceOptions{}))
	c0 := cpuTime(t)
	time.Sleep(2 * time.Second)
	used := cpuTime(t) - c0
	t.Logf("idle CPU of a group over 2 s: %v (%.1f%% of one core)", used, 100*used.Seconds()/2)
	if used > 200*time.Millisecond {
		t.Fatalf("an idle group used %v of CPU in 2 s", used)
	}
}

// done returns wait bound to t, for done(t)(b.Op(...)).
func done(t *testing.T) func(backend.Work, error) {
	return func(w backend.Work, err error) { t.Helper(); wait(t, w, err) }
}
