package cpupool_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// group starts n cpupool backends, goroutines of this process, over a
// HashStore and real TCP.
func group(t *testing.T, n int, opts *cpupool.Options) []backend.Backend {
	t.Helper()
	st := store.NewHashStore()
	bs := make([]backend.Backend, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			bs[r], errs[r] = cpupool.New(context.Background(), backend.Config{Store: st, Rank: r, WorldSize: n, Timeout: 20 * time.Second, Options: opts})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Close waits for issued ops, which a failed test may have left
	// without a peer and, called directly with a zero Meta, without a
	// timeout: bound it, then abort.
	t.Cleanup(func() {
		for _, b := range bs {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if b.Close(ctx) != nil {
				_ = b.Abort(context.Background(), errors.New("test cleanup: Close timed out"))
			}
			cancel()
		}
	})
	return bs
}

// each runs f on every rank at once. It is bounded on its own: ops called
// on the backend directly with a zero Meta have no timeout, so a bug that
// lets the ranks fall out of step must fail here, not hang until go
// test's deadline.
// refusedAllreduce runs an allreduce of input(r) on every rank r of bs,
// inputs the ranks disagree on, and checks that every rank fails with
// ErrInvalidArgument, quickly (not at its 15 s op timeout). It returns the
// ranks' errors.
func refusedAllreduce(ctx context.Context, t *testing.T, bs []backend.Backend, input func(r int) *tensor.Tensor) []error {
	t.Helper()
	errs := make([]error, len(bs))
	start := time.Now()
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			w, err := b.Allreduce(ctx, backend.Meta{Timeout: 15 * time.Second}, []*tensor.Tensor{input(r)}, backend.AllreduceOptions{})
			if err == nil {
				err = w.Wait(ctx)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v: a rank waited for its timeout", el)
	}
	for r, err := range errs {
		if !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("rank %d: want ErrInvalidArgument, got %v", r, err)
		}
	}
	return errs
}

// checkUsable runs one allreduce on every rank of bs and checks its sums:
// after a failed op the group must stay usable, with no straggler of the
// failed op leaking into the next one.
func checkUsable(ctx context.Context, t *testing.T, bs []backend.Backend, meta backend.Meta) {
	t.Helper()
	each(t, bs, func(r int, b backend.Backend) error {
		x, _ := tensor.FromSlice([]float32{1, float32(r)})
		w, err := b.Allreduce(ctx, meta, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		n := len(bs)
		if got, _ := tensor.ToSlice[float32](x); got[0] != float32(n) || got[1] != float32(n*(n-1)/2) {
			return fmt.Errorf("rank %d: allreduce after the failure: %v", r, got)
		}
		return nil
	})
}

func each(t *testing.T, bs []backend.Backend, f func(r int, b backend.Backend) error) {
	t.Helper()
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() { errs[r] = f(r, b) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		for _, b := range bs {
			_ = b.Abort(context.Background(), errors.New("each: the ranks did not finish in a minute"))
		}
		t.Fatal("the ranks did not finish in a minute")
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestOps(t *testing.T) {
	ctx := context.Background()
	const n = 3
	bs := group(t, n, nil)
	each(t, bs, func(r int, b backend.Backend) error {
		x, _ := tensor.FromSlice([]float32{float32(r), 1, 2})
		w, err := b.Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
		if err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if got, _ := tensor.ToSlice[float32](x); got[0] != 3 || got[1] != 3 || got[2] != 6 {
			return fmt.Errorf("allreduce: %v", got)
		}
		h, _ := tensor.FromFloat64s(tensor.Float16, []float64{float64(r), 0.5})
		if w, err = b.Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{h}, backend.AllreduceOptions{ReduceOp: backend.AVG}); err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if got, _ := h.Float64s(); got[0] != 1 || got[1] != 0.5 {
			return fmt.Errorf("fp16 avg: %v", got)
		}
		in, _ := tensor.FromSlice([]int32{int32(r)})
		out := tensor.New(tensor.Int32, n)
		if w, err = b.AllgatherIntoTensor(ctx, backend.Meta{}, out, in, backend.AllgatherIntoTensorOptions{}); err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if got, _ := tensor.ToSlice[int32](out); got[0] != 0 || got[1] != 1 || got[2] != 2 {
			return fmt.Errorf("allgather: %v", got)
		}
		// send/recv ring with a user tag, and recv_anysource on rank 0
		st, _ := tensor.FromSlice([]int64{int64(r)})
		rt := tensor.New(tensor.Int64, 1)
		sw, err := b.Send(ctx, backend.Meta{}, []*tensor.Tensor{st}, (r+1)%n, backend.SendOptions{Tag: 7})
		if err != nil {
			return err
		}
		rw, err := b.Recv(ctx, backend.Meta{}, []*tensor.Tensor{rt}, (r+n-1)%n, backend.RecvOptions{Tag: 7})
		if err != nil {
			return err
		}
		if err := errors.Join(sw.Wait(ctx), rw.Wait(ctx)); err != nil {
			return err
		}
		if got, _ := tensor.ToSlice[int64](rt); got[0] != int64((r+n-1)%n) {
			return fmt.Errorf("recv: %v", got)
		}
		if r == 2 {
			if sw, err = b.Send(ctx, backend.Meta{}, []*tensor.Tensor{st}, 0, backend.SendOptions{Tag: 9}); err != nil {
				return err
			}
			if err := sw.Wait(ctx); err != nil {
				return err
			}
		}
		if r == 0 {
			aw, err := b.RecvAnysource(ctx, backend.Meta{}, []*tensor.Tensor{rt}, backend.RecvAnysourceOptions{Tag: 9})
			if err != nil {
				return err
			}
			if err := aw.Wait(ctx); err != nil {
				return err
			}
			if src, err := aw.(backend.SourceRanker).SourceRank(); err != nil || src != 2 {
				return fmt.Errorf("anysource: %d %v", src, err)
			}
		}
		bw, err := b.Barrier(ctx, backend.Meta{}, backend.BarrierOptions{})
		if err != nil {
			return err
		}
		return bw.Wait(ctx)
	})
}

func TestTimeoutNamesLateRank(t *testing.T) {
	ctx := context.Background()
	bs := group(t, 3, nil)
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 { // rank 2 never joins
		wg.Go(func() {
			x := tensor.New(tensor.Float32, 4)
			w, err := bs[r].Allreduce(ctx, backend.Meta{Timeout: 500 * time.Millisecond}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = w.Wait(ctx)
		})
	}
	// Bounded on its own: if timeouts stopped working, the test must fail
	// here, not hang until go test's deadline.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a 500 ms timeout had not fired after 10 s")
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Errorf("took %v", el)
	}
	for r, err := range errs {
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrTimeout) || !errors.As(err, &oe) || len(oe.Ranks) != 1 || oe.Ranks[0] != 2 {
			t.Errorf("rank %d: want ErrTimeout naming rank 2, got %v", r, err)
		}
	}
}

func TestPeerDeathIsRemoteError(t *testing.T) {
	expectPeerDeathRemote(t, nil, 1<<16)
}

// expectPeerDeathRemote starts an allreduce of n float32 on rank 0 of a
// 3-rank group made with opts, aborts rank 2 (closing its connections, as
// a crash does) while rank 0 waits, and wants rank 0's Wait to fail with
// ErrRemote naming a rank within 5 s.
func expectPeerDeathRemote(t *testing.T, opts *cpupool.Options, n int) {
	t.Helper()
	ctx := context.Background()
	bs := group(t, 3, opts)
	x := tensor.New(tensor.Float32, n)
	w0, err := bs[0].Allreduce(ctx, backend.Meta{Timeout: time.Minute}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = bs[2].Abort(ctx, errors.New("simulated crash"))
	done := make(chan error, 1)
	go func() { done <- w0.Wait(ctx) }()
	select {
	case err := <-done:
		var oe *backend.OpError
		if !errors.Is(err, backend.ErrRemote) || !errors.As(err, &oe) || len(oe.Ranks) == 0 {
			t.Fatalf("want ErrRemote naming a rank, got %v", err)
		}
		t.Log(err)
	case <-time.After(5 * time.Second):
		t.Fatal("hang after peer death")
	}
}

func TestAbortFailsPending(t *testing.T) {
	ctx := context.Background()
	bs := group(t, 2, nil)
	x := tensor.New(tensor.Float32, 8)
	w, err := bs[0].Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.IsCompleted() {
		t.Fatal("completed without the peer")
	}
	_ = bs[0].Abort(ctx, errors.New("test abort"))
	if err := w.Wait(ctx); !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("want ErrAborted, got %v", err)
	}
	if _, err := bs[0].Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{}); !errors.Is(err, backend.ErrAborted) {
		t.Fatalf("after abort: %v", err)
	}
}

// TestMismatchedSizes: ranks that pass tensors of different sizes to one
// allreduce must all fail with ErrInvalidArgument, naming the sizes, and
// quickly: not hang until the timeout, and not return corrupt data. The
// cases cover the small-message path, the ring (where equal segment sizes
// with different counts could otherwise pair up the wrong messages), a
// mix of both, and a world of 3 where only one rank is off.
func TestMismatchedSizes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		elems []int
	}{
		{"small", []int{4, 8}},
		{"ring", []int{1 << 20, 3 << 19}}, // 4 MiB vs 6 MiB: 1 MiB segments on both
		{"small vs ring", []int{4, 1 << 20}},
		{"three ranks", []int{1 << 18, 1 << 18, 1<<18 + 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := group(t, len(tc.elems), nil)
			for r, err := range refusedAllreduce(ctx, t, bs, func(r int) *tensor.Tensor { return tensor.New(tensor.Float32, tc.elems[r]) }) {
				t.Logf("rank %d: %v", r, err)
			}
			// The group stays usable: stragglers of the failed op must
			// not leak into the next one.
			checkUsable(ctx, t, bs, backend.Meta{})
		})
	}
}

func TestTransportOption(t *testing.T) {
	st := store.NewHashStore()
	_, err := cpupool.New(context.Background(), backend.Config{Store: st, Rank: 0, WorldSize: 1, Options: &cpupool.Options{Transport: "carrier-pigeon"}})
	if !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("want ErrInvalidArgument, got %v", err)
	}
	for _, tr := range []string{"tcp", "shm"} {
		bs := group(t, 2, &cpupool.Options{Transport: tr})
		if got := bs[0].(*cpupool.Backend).Options().Transport; got != tr {
			t.Fatalf("transport %q in effect, want %q", got, tr)
		}
		each(t, bs, func(r int, b backend.Backend) error {
			x := tensor.New(tensor.Float32, 1<<18) // the ring path
			x.Fill(1)
			w, err := b.Allreduce(context.Background(), backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
			if err != nil {
				return err
			}
			if err := w.Wait(context.Background()); err != nil {
				return err
			}
			if got, _ := tensor.ToSlice[float32](x); got[0] != 2 || got[len(got)-1] != 2 {
				return fmt.Errorf("%s: %v", tr, got[:2])
			}
			return nil
		})
	}
}

// BenchmarkAllreduce runs allreduce + Wait on two ranks of this process
// (so the two share GOMAXPROCS, unlike conftest bench's processes).
func BenchmarkAllreduce(b *testing.B) {
	for _, tr := range []string{"tcp", "shm"} {
		for _, n := range []int{2, 1 << 10, 1 << 18, 1 << 22} {
			b.Run(fmt.Sprintf("%s/%dB", tr, 4*n), func(b *testing.B) {
				t := &testing.T{}
				bs := group(t, 2, &cpupool.Options{Transport: tr})
				defer func() {
					for _, x := range bs {
						_ = x.Close(context.Background())
					}
				}()
				ctx := context.Background()
				xs := []*tensor.Tensor{tensor.New(tensor.Float32, n), tensor.New(tensor.Float32, n)}
				iters := make(chan int)
				done := make(chan error)
				go func() {
					for k := range iters {
						var err error
						for range k {
							var w backend.Work
							if w, err = bs[1].Allreduce(ctx, backend.Meta{}, xs[1:], backend.AllreduceOptions{}); err == nil {
								err = w.Wait(ctx)
							}
							if err != nil {
								break
							}
						}
						done <- err
					}
				}()
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				iters <- b.N
				for range b.N {
					w, err := bs[0].Allreduce(ctx, backend.Meta{}, xs[:1], backend.AllreduceOptions{})
					if err == nil {
						err = w.Wait(ctx)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				close(iters)
			})
		}
	}
}

// TestRingDTypes runs the ring allreduce (the receive combines in place,
// straight out of shared memory) on element sizes 1, 2 and 8 with odd
// lengths and small segments, so that segments, frames and padding fall
// at every alignment.
func TestRingDTypes(t *testing.T) {
	ctx := context.Background()
	for _, tr := range []string{"shm", "tcp"} {
		bs := group(t, 3, &cpupool.Options{Transport: tr, SmallBytes: 64, SegmentBytes: 4096, ShmRingBytes: 1 << 14})
		for _, dt := range []tensor.DType{tensor.Int8, tensor.Float16, tensor.Float64} {
			each(t, bs, func(r int, b backend.Backend) error {
				const n = 30001
				vals := make([]float64, n)
				for i := range vals {
					vals[i] = float64((i + r) % 5)
				}
				x, err := tensor.FromFloat64s(dt, vals)
				if err != nil {
					return err
				}
				w, err := b.Allreduce(ctx, backend.Meta{}, []*tensor.Tensor{x}, backend.AllreduceOptions{})
				if err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
				got, _ := x.Float64s()
				for i, v := range got {
					want := float64(i%5 + (i+1)%5 + (i+2)%5)
					if v != want {
						return fmt.Errorf("%s %v rank %d: element %d = %v, want %v", tr, dt, r, i, v, want)
					}
				}
				return nil
			})
		}
	}
}
