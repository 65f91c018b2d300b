// Hand-written declarations of the cuBLAS subset that the overlap benchmark
// uses (cublas_api.h of CUDA 12/13; no NVIDIA header is needed to build):
// cublasCreate_v2, cublasSetStream_v2, cublasGemmEx, cublasDestroy_v2, and
// two driver entry points (cuMemAlloc_v2, cuMemFree_v2) taken from package
// cuda's libcuda through cuda.Symbol.
#ifndef GOCOLL_GPUBENCH_GB_H
#define GOCOLL_GPUBENCH_GB_H

#include <stddef.h>
#include <stdint.h>

// gb_bind takes the addresses of, in order: cublasCreate_v2,
// cublasSetStream_v2, cublasGemmEx, cublasDestroy_v2, cuCtxSetCurrent,
// cuMemAlloc_v2, cuMemFree_v2.
void gb_bind(const uintptr_t *addrs);

// The calls below make ctx current first (a goroutine may have moved to
// another OS thread since its last cgo call) and return the library's
// status (cublasStatus_t or CUresult); 0 is success.
int gb_create(uintptr_t ctx, uintptr_t *handle);
int gb_destroy(uintptr_t ctx, uintptr_t handle);
// gb_gemm_bf16 is C = A x B for n x n bf16 column-major matrices, float32
// accumulation (CUBLAS_COMPUTE_32F), on stream: cublasSetStream and
// cublasGemmEx in one crossing.
int gb_gemm_bf16(uintptr_t ctx, uintptr_t handle, uintptr_t stream, int n, uintptr_t a, uintptr_t b, uintptr_t c);
int gb_mem_alloc(uintptr_t ctx, uintptr_t *p, size_t n);
int gb_mem_free(uintptr_t ctx, uintptr_t p);

#endif
