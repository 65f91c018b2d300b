package stage_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/internal/stage"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// rankEnv is one rank of a test: cpupool behind the stage wrapper, on a
// fake CUDA device 0.
type rankEnv struct {
	b *stage.Backend
	e *fakeEngine
}

// group starts n cpupool ranks in this process, each wrapped.
func group(t *testing.T, n int) []rankEnv {
	t.Helper()
	st := store.NewHashStore()
	out := make([]rankEnv, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			inner, err := cpupool.New(context.Background(), backend.Config{Store: st, Rank: r, WorldSize: n, Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			e := newFakeEngine(0)
			out[r] = rankEnv{b: stage.Wrap(inner, engines(e)), e: e}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range out {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if r.b.Close(ctx) != nil {
				_ = r.b.Abort(context.Background(), errors.New("test cleanup: Close timed out"))
			}
			cancel()
		}
	})
	return out
}

func meta(op backend.Op, seq uint64, timeout time.Duration) backend.Meta {
	return backend.Meta{Op: op, Seq: seq, Timeout: timeout}
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A staged op waits for the caller's stream and the host does not block;
// a CPU op issued after it goes to the host backend after it, so the ranks
// still agree on the sequence (a swap would pair rank 0's 1-element
// tensor with rank 1's 2-element one and fail). Wait orders the current
// stream without blocking; the result is on the device after it.
func TestStagedOpKeepsIssueOrder(t *testing.T) {
	rs := group(t, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, re := range rs {
		wg.Go(func() {
			errs[r] = func() error {
				ctx := context.Background()
				var g gate
				if r == 0 {
					g = re.e.def.hold()
					defer g.open()
				}
				x := fakeTensor(0, float32(r+1), float32(10*(r+1)))
				y, _ := tensor.FromSlice([]float32{float32(100 * (r + 1))})
				t0 := time.Now()
				wx, err := re.b.Allreduce(ctx, meta(backend.OpAllreduce, 1, 0), []*tensor.Tensor{x}, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				wy, err := re.b.Allreduce(ctx, meta(backend.OpAllreduce, 2, 0), []*tensor.Tensor{y}, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				if d := time.Since(t0); d > 200*time.Millisecond {
					t.Errorf("rank %d: issuing took %v: the host blocked", r, d)
				}
				if r == 0 {
					time.Sleep(100 * time.Millisecond)
					if wx.IsCompleted() || wy.IsCompleted() {
						t.Errorf("rank 0: completed while the current stream is held (staged %v, cpu %v)", wx.IsCompleted(), wy.IsCompleted())
					}
					t1 := time.Now()
					if err := wx.Wait(ctx); err != nil {
						return err
					}
					if d := time.Since(t1); d > 100*time.Millisecond {
						t.Errorf("Wait blocked the host %v", d)
					}
					re.e.mu.Lock()
					ordered := slices.Clone(re.e.ordered)
					re.e.mu.Unlock()
					if len(ordered) != 1 || ordered[0] != re.e.def {
						t.Errorf("Wait ordered %v, want the current (default) stream", ordered)
					}
					g.open()
				} else if err := wx.Wait(ctx); err != nil {
					return err
				}
				if err := wy.Wait(ctx); err != nil {
					return err
				}
				if err := wx.WaitHost(waitCtx(t)); err != nil {
					return err
				}
				if got := values(re.e.def, x); !slices.Equal(got, []float32{3, 30}) {
					t.Errorf("rank %d: staged allreduce gave %v, want [3 30]", r, got)
				}
				if got, _ := tensor.ToSlice[float32](y); !slices.Equal(got, []float32{300}) {
					t.Errorf("rank %d: cpu allreduce gave %v, want [300]", r, got)
				}
				if v, err := wx.Future().Value(); err != nil || len(v) != 1 || v[0] != x {
					t.Errorf("rank %d: future %v %v, want the device tensor", r, v, err)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, re := range rs {
		if stashed, freed := re.e.counts(); stashed != 0 || freed != 1 {
			t.Errorf("rank %d: %d tensors still stashed, %d freed; want 0 and 1", r, stashed, freed)
		}
	}
}

// A staged op whose stream never releases it, with a peer that never
// joins, times out through the host backend (cpupool names the late rank),
// before the stream is released; the stash is kept until the device is
// done with it.
func TestStagedTimeoutGoesThroughHostBackend(t *testing.T) {
	rs := group(t, 2)
	re := rs[0]
	g := re.e.def.hold()
	defer g.open()
	x := fakeTensor(0, 1, 2)
	t0 := time.Now()
	w, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 1, 300*time.Millisecond), []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = w.WaitHost(waitCtx(t))
	d := time.Since(t0)
	var oe *backend.OpError
	if !errors.Is(err, backend.ErrTimeout) || !errors.As(err, &oe) {
		t.Fatalf("WaitHost: %v, want an *OpError of ErrTimeout", err)
	}
	if oe.Backend != cpupool.Name || !slices.Equal(oe.Ranks, []int{1}) {
		t.Errorf("timeout %v: want cpupool's, naming rank 1", err)
	}
	if d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("timed out after %v, want about 300ms", d)
	}
	if stashed, _ := re.e.counts(); stashed != 1 {
		t.Errorf("%d tensors stashed while the stream still holds the op, want 1", stashed)
	}
	g.open()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if stashed, freed := re.e.counts(); stashed == 0 && freed == 1 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Error("the stash was not released once the stream let the op through")
}

// WaitHost honours its context: a *backend.WaitError while the stream
// holds the op; the op then completes normally.
func TestWaitHostHonoursContext(t *testing.T) {
	re := group(t, 1)[0]
	g := re.e.def.hold()
	defer g.open()
	x := fakeTensor(0, 4)
	w, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 1, 0), []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var we *backend.WaitError
	if err := w.WaitHost(ctx); !errors.As(err, &we) || !errors.Is(err, backend.ErrTimeout) {
		t.Fatalf("WaitHost under a 50ms context: %v, want a *backend.WaitError", err)
	}
	if w.IsCompleted() {
		t.Fatal("completed while the stream holds it")
	}
	g.open()
	if err := w.WaitHost(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := values(re.e.def, x); !slices.Equal(got, []float32{4}) {
		t.Errorf("got %v, want [4]", got)
	}
}

// A barrier's Wait returns only once the staged op before it is back on
// the device.
func TestBarrierWaitsForStagedOps(t *testing.T) {
	re := group(t, 1)[0]
	g := re.e.def.hold()
	defer g.open()
	w, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 1, 0), []*tensor.Tensor{fakeTensor(0, 1)}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bw, err := re.b.Barrier(context.Background(), meta(backend.OpBarrier, 2, 0), backend.BarrierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- bw.Wait(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("the barrier returned (%v) while the op before it is held", err)
	case <-time.After(100 * time.Millisecond):
	}
	if bw.IsCompleted() {
		t.Fatal("the barrier reports completion while the op before it is held")
	}
	g.open()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the barrier did not return once the stream was released")
	}
	if !w.IsCompleted() || !bw.IsCompleted() {
		t.Fatal("barrier returned before the staged op completed")
	}
}

// Abort fails a held staged op at once with ErrAborted.
func TestAbortFailsStagedOps(t *testing.T) {
	re := group(t, 1)[0]
	g := re.e.def.hold()
	defer g.open()
	w, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 1, 0), []*tensor.Tensor{fakeTensor(0, 1)}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reason := errors.New("test abort")
	if err := re.b.Abort(context.Background(), reason); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := w.WaitHost(ctx); !errors.Is(err, backend.ErrAborted) || !errors.Is(err, reason) {
		t.Fatalf("WaitHost after Abort: %v, want ErrAborted keeping the reason", err)
	}
	if _, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 2, 0), []*tensor.Tensor{fakeTensor(0, 1)}, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("an op after Abort: %v, want ErrAborted", err)
	}
}

// otherStream is a stream of no engine's kind.
type otherStream struct{}

func (otherStream) Device() int     { return 0 }
func (otherStream) Handle() uintptr { return 1 }

// BlockStream orders a stream of the device's kind and refuses others;
// the capabilities declare CUDA and stream semantics; recv_anysource of
// CUDA tensors and non-contiguous ones are refused at issue.
func TestStreamsCapabilitiesAndRefusals(t *testing.T) {
	re := group(t, 1)[0]
	caps := re.b.Capabilities()
	if !slices.Contains(caps.Devices, tensor.CUDA) || !slices.Contains(caps.Devices, tensor.CPU) || !caps.StreamSemantics {
		t.Errorf("capabilities %+v: want CPU and CUDA with stream semantics", caps)
	}
	x := fakeTensor(0, 1, 2)
	w, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 1, 0), []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := newFakeStream(0)
	if err := w.BlockStream(other); err != nil {
		t.Errorf("BlockStream on a stream of the device: %v", err)
	}
	if err := w.BlockStream(otherStream{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("BlockStream on a foreign stream: %v, want ErrInvalidArgument", err)
	}
	if err := w.WaitHost(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := values(other, x); !slices.Equal(got, []float32{1, 2}) {
		t.Errorf("after BlockStream: %v", got)
	}
	if _, err := re.b.RecvAnysource(context.Background(), meta(backend.OpRecvAnysource, 1, 0), []*tensor.Tensor{x}, backend.RecvAnysourceOptions{}); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("recv_anysource of a CUDA tensor: %v, want ErrUnsupported", err)
	}
	nc, err := fakeTensor(0, 1, 2, 3, 4).AsStrided([]int{2}, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 2, 0), []*tensor.Tensor{nc}, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("non-contiguous CUDA tensor: %v, want ErrInvalidArgument", err)
	}
	if _, err := re.b.Allreduce(context.Background(), meta(backend.OpAllreduce, 3, 0), []*tensor.Tensor{fakeTensor(1, 1)}, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrUnavailable) {
		t.Errorf("a tensor of a device without an engine: %v, want ErrUnavailable", err)
	}
}

// TestHostOpsGoStraightThrough: a host op with nothing staged before it
// costs the wrapper no allocation of its own (hostNow): the same count
// per Allreduce and Wait through the wrapper as on the host backend.
func TestHostOpsGoStraightThrough(t *testing.T) {
	re := group(t, 1)[0]
	inner := re.b.Unwrap()
	ctx := context.Background()
	x := []*tensor.Tensor{tensor.New(tensor.Float32, 2)}
	run := func(b backend.Backend) func() {
		return func() {
			w, err := b.Allreduce(ctx, meta(backend.OpAllreduce, 0, 0), x, backend.AllreduceOptions{})
			if err == nil {
				err = w.Wait(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	direct := testing.AllocsPerRun(200, run(inner))
	wrapped := testing.AllocsPerRun(200, run(re.b))
	if wrapped > direct {
		t.Fatalf("a host allreduce through the wrapper: %v allocations, on the host backend itself %v", wrapped, direct)
	}
}
