// Package gpubench holds the GPU pieces of `conftest bench overlap` that
// gocoll itself does not need: a bf16 GEMM through cuBLAS (dlopen'd, as
// libcuda and libnccl are, so the package builds with Go and gcc alone),
// and synchronous device allocations (cuMemAlloc/cuMemFree, through package
// cuda's libcuda), which the frag killer uses to stand for a caching
// allocator that must give memory back.
package gpubench

/*
#include "gb.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/dl"
	"github.com/gocoll/gocoll/tensor"
)

// LibraryEnv names the variable that points at libcublas.
const LibraryEnv = "GOCOLL_CUBLAS_LIBRARY"

// candidates are where cuBLAS is looked for without LibraryEnv: the
// sonames of CUDA 13 and 12, then the toolkit's usual places (the GPU
// machine's CUDA 13 toolkit is in /usr/local/cuda).
var candidates = []string{
	"libcublas.so.13", "libcublas.so.12",
	"/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13",
	"/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so",
}

var loader struct {
	once sync.Once
	lib  *dl.Library
	err  error
}

// Load opens cuBLAS and binds its entry points and the two driver calls.
// It is cheap after the first call.
func Load() error {
	loader.once.Do(func() {
		if err := cuda.Load(); err != nil {
			loader.err = err
			return
		}
		lib, err := dl.Open(dl.Spec{What: "the cuBLAS library libcublas.so", Env: LibraryEnv, Candidates: candidates,
			Symbols: []dl.Symbol{{Name: "cublasCreate_v2"}, {Name: "cublasSetStream_v2"}, {Name: "cublasGemmEx"}, {Name: "cublasDestroy_v2"}}})
		if err != nil {
			loader.err = fmt.Errorf("gpubench: %w", err)
			return
		}
		addrs := append([]uintptr{}, lib.Addrs()...)
		for _, name := range []string{"cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemFree_v2"} {
			a, err := cuda.Symbol(name)
			if err != nil {
				loader.err = fmt.Errorf("gpubench: %w", err)
				return
			}
			addrs = append(addrs, a)
		}
		C.gb_bind((*C.uintptr_t)(unsafe.Pointer(&addrs[0])))
		loader.lib = lib
	})
	return loader.err
}

// LibraryPath is the cuBLAS that Load opened, or "".
func LibraryPath() string {
	if Load() != nil {
		return ""
	}
	return loader.lib.Path()
}

// Gemm is C = A x B for n x n bf16 matrices on one device, accumulated in
// float32 (CUBLAS_COMPUTE_32F), the article's `a @ b` of two bf16 tensors.
type Gemm struct {
	dev     *cuda.Device
	handle  uintptr
	n       int
	a, b, c *tensor.Tensor
}

// NewGemm makes a cuBLAS handle and the three n x n matrices on dev, in
// stream order on ctx's current stream, A and B filled with 1.0.
func NewGemm(ctx context.Context, dev *cuda.Device, n int) (*Gemm, error) {
	if n <= 0 {
		return nil, fmt.Errorf("gpubench: GEMM size %d must be positive", n)
	}
	if err := Load(); err != nil {
		return nil, err
	}
	g := &Gemm{dev: dev, n: n}
	var h C.uintptr_t
	if r := C.gb_create(C.uintptr_t(dev.Context()), &h); r != 0 {
		return nil, fmt.Errorf("gpubench: cublasCreate failed (status %d)", int(r))
	}
	g.handle = uintptr(h)
	var err error
	for _, p := range []**tensor.Tensor{&g.a, &g.b, &g.c} {
		if *p, err = cuda.Empty(ctx, dev.Ordinal(), tensor.BFloat16, n, n); err != nil {
			g.Close()
			return nil, err
		}
	}
	s := cuda.StreamFor(ctx, dev)
	for _, t := range []*tensor.Tensor{g.a, g.b} {
		// 0x3f80 is bf16 1.0: every product is exact and C holds n.
		if err := s.Memset32(t.Ptr(), 0x3f803f80, n*n/2); err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Run queues the GEMM on s.
func (g *Gemm) Run(s *cuda.Stream) error {
	if r := C.gb_gemm_bf16(C.uintptr_t(g.dev.Context()), C.uintptr_t(g.handle), C.uintptr_t(s.Handle()), C.int(g.n),
		C.uintptr_t(g.a.Ptr()), C.uintptr_t(g.b.Ptr()), C.uintptr_t(g.c.Ptr())); r != 0 {
		return fmt.Errorf("gpubench: cublasGemmEx (bf16, n=%d) failed (status %d)", g.n, int(r))
	}
	return nil
}

// Output is C.
func (g *Gemm) Output() *tensor.Tensor { return g.c }

// Close frees the matrices and the handle.
func (g *Gemm) Close() error {
	var errs []error
	for _, t := range []*tensor.Tensor{g.a, g.b, g.c} {
		if t != nil {
			errs = append(errs, t.Free())
		}
	}
	g.a, g.b, g.c = nil, nil, nil
	if g.handle != 0 {
		if r := C.gb_destroy(C.uintptr_t(g.dev.Context()), C.uintptr_t(g.handle)); r != 0 {
			errs = append(errs, fmt.Errorf("gpubench: cublasDestroy failed (status %d)", int(r)))
		}
		g.handle = 0
	}
	return errors.Join(errs...)
}

// AllocSync is cuMemAlloc: device memory outside any stream order, whose
// FreeSync (cuMemFree) waits for the device, as cudaFree in PyTorch's
// caching allocator does when it releases cached blocks.
func AllocSync(dev *cuda.Device, n int) (uintptr, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	var p C.uintptr_t
	if r := C.gb_mem_alloc(C.uintptr_t(dev.Context()), &p, C.size_t(n)); r != 0 {
		return 0, fmt.Errorf("gpubench: cuMemAlloc(%d bytes) failed (CUresult %d)", n, int(r))
	}
	return uintptr(p), nil
}

// FreeSync is cuMemFree of memory from AllocSync.
func FreeSync(dev *cuda.Device, p uintptr) error {
	if r := C.gb_mem_free(C.uintptr_t(dev.Context()), C.uintptr_t(p)); r != 0 {
		return fmt.Errorf("gpubench: cuMemFree failed (CUresult %d)", int(r))
	}
	return nil
}
