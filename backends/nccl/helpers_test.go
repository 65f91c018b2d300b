package nccl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl/internal/ncclhook"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

func TestMain(m *testing.M) {
	// NVLink multicast must stay off on the shared GPU machines (GPU.md).
	if os.Getenv("NCCL_NVLS_ENABLE") == "" {
		os.Setenv("NCCL_NVLS_ENABLE", "0")
	}
	os.Exit(m.Run())
}

// gpus returns the number of GPUs, or skips with "no CUDA device" (or the
// reason NCCL cannot load).
func gpus(t testing.TB) int {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if err := Load(); err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	n, _ := cuda.DeviceCount()
	return n
}

// rankEnv is one in-process rank: rank r drives GPU r from its own
// goroutine (NCCL allows several ranks per process when each is on its own
// device and thread).
type rankEnv struct {
	r    int
	n    int
	b    *Backend
	dev  *cuda.Device
	cur  *cuda.Stream // the test's current stream
	ctx  context.Context
	seq  uint64
	errs []error
}

func (e *rankEnv) meta(op backend.Op) backend.Meta {
	e.seq++
	return backend.Meta{Op: op, Seq: e.seq, Timeout: e.b.cfg.Timeout}
}

// newRanks makes world ranks (default: every GPU) sharing a HashStore, each
// with an eagerly created communicator and a current stream.
func newRanks(t testing.TB, world int, opts Options) []*rankEnv {
	t.Helper()
	return newRanksKnobs(t, world, opts, ncclhook.Knobs{})
}

// newRanksKnobs is newRanks with the test-only knobs k.
func newRanksKnobs(t testing.TB, world int, opts Options, k ncclhook.Knobs) []*rankEnv {
	t.Helper()
	po := &opts
	ncclhook.Set(po, k)
	n := gpus(t)
	if world <= 0 {
		world = n
	}
	if world > n {
		t.Skipf("needs %d GPUs, have %d", world, n)
	}
	st := store.NewHashStore()
	envs := make([]*rankEnv, world)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := tensor.CUDADevice(r)
			b, err := New(context.Background(), backend.Config{Store: st, Rank: r, WorldSize: world, GroupName: "0",
				GroupDesc: "test", Timeout: time.Minute, Device: &dev, Options: po})
			if err != nil {
				errs[r] = err
				return
			}
			d, _ := cuda.GetDevice(r)
			s, err := d.NewStream(cuda.StreamOptions{})
			if err != nil {
				errs[r] = err
				return
			}
			envs[r] = &rankEnv{r: r, n: world, b: b, dev: d, cur: s, ctx: cuda.WithStream(context.Background(), s)}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Concurrently: destroying a communicator may wait for its peers.
		var wg sync.WaitGroup
		for _, e := range envs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				e.b.Close(ctx)
			}()
		}
		wg.Wait()
	})
	return envs
}

func testOpts() Options {
	o := DefaultOptions()
	o.ErrorPolicy = NoHandling
	return o
}

// each runs fn on every rank concurrently and fails t with their errors.
func each(t testing.TB, envs []*rankEnv, fn func(e *rankEnv) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(envs))
	for i, e := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("rank %d panicked: %v", e.r, p)
				}
			}()
			if err := fn(e); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", e.r, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// fromFloats makes a device tensor on e's device on its current stream.
func (e *rankEnv) fromFloats(dt tensor.DType, vals []float64) (*tensor.Tensor, error) {
	h, err := tensor.FromFloat64s(dt, vals)
	if err != nil {
		return nil, err
	}
	return cuda.FromHost(e.ctx, e.r, h)
}

func (e *rankEnv) fill(dt tensor.DType, n int, f func(i int) float64) (*tensor.Tensor, error) {
	v := make([]float64, n)
	for i := range v {
		v[i] = f(i)
	}
	return e.fromFloats(dt, v)
}

// read copies t to the host on e's current stream (blocking).
func (e *rankEnv) read(t *tensor.Tensor) ([]float64, error) {
	h, err := cuda.ToHost(e.ctx, t)
	if err != nil {
		return nil, err
	}
	return h.Float64s()
}

// expect reads t back (blocking) and compares it with want.
func (e *rankEnv) expect(t *tensor.Tensor, want func(i int) float64) error {
	got, err := e.read(t)
	if err != nil {
		return err
	}
	return expect(got, want)
}

func expect(got []float64, want func(i int) float64) error {
	for i, g := range got {
		if w := want(i); g != w {
			return fmt.Errorf("element %d = %v, want %v", i, g, w)
		}
	}
	return nil
}

// pinnedF32 reads float32 i of pinned memory.
func pinnedF32(h *cuda.HostBuffer, i int) float64 {
	t, _ := tensor.FromBytes(tensor.Float32, h.Bytes()[4*i:4*i+4], 1)
	return t.At(0)
}

func cudaFromHost(e *rankEnv, h *tensor.Tensor) (*tensor.Tensor, error) {
	return cuda.FromHost(e.ctx, e.r, h)
}

func getenv(k string) string { return os.Getenv(k) }
