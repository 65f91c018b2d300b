#include "gb.h"

typedef int (*fn_create)(void **);
typedef int (*fn_set_stream)(void *, void *);
typedef int (*fn_gemm_ex)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                          const void *, void *, int, int, int, int);
typedef int (*fn_destroy)(void *);
typedef int (*fn_ctx_set)(void *);
typedef int (*fn_alloc)(unsigned long long *, size_t);
typedef int (*fn_free)(unsigned long long);

static fn_create p_create;
static fn_set_stream p_set_stream;
static fn_gemm_ex p_gemm_ex;
static fn_destroy p_destroy;
static fn_ctx_set p_ctx_set;
static fn_alloc p_alloc;
static fn_free p_free;

// cublas_api.h / library_types.h values.
enum {
	CUBLAS_OP_N = 0,
	CUDA_R_32F = 0,
	CUDA_R_16BF = 14,
	CUBLAS_COMPUTE_32F = 68,
	CUBLAS_GEMM_DEFAULT = -1,
};

void gb_bind(const uintptr_t *a) {
	p_create = (fn_create)a[0];
	p_set_stream = (fn_set_stream)a[1];
	p_gemm_ex = (fn_gemm_ex)a[2];
	p_destroy = (fn_destroy)a[3];
	p_ctx_set = (fn_ctx_set)a[4];
	p_alloc = (fn_alloc)a[5];
	p_free = (fn_free)a[6];
}

int gb_create(uintptr_t ctx, uintptr_t *handle) {
	int r = p_ctx_set((void *)ctx);
	if (r) return 1000 + r;
	void *h = 0;
	r = p_create(&h);
	*handle = (uintptr_t)h;
	return r;
}

int gb_destroy(uintptr_t ctx, uintptr_t handle) {
	int r = p_ctx_set((void *)ctx);
	if (r) return 1000 + r;
	return p_destroy((void *)handle);
}

int gb_gemm_bf16(uintptr_t ctx, uintptr_t handle, uintptr_t stream, int n, uintptr_t a, uintptr_t b, uintptr_t c) {
	int r = p_ctx_set((void *)ctx);
	if (r) return 1000 + r;
	r = p_set_stream((void *)handle, (void *)stream);
	if (r) return r;
	const float alpha = 1.0f, beta = 0.0f;
	return p_gemm_ex((void *)handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, (const void *)a, CUDA_R_16BF, n,
	                 (const void *)b, CUDA_R_16BF, n, &beta, (void *)c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
	                 CUBLAS_GEMM_DEFAULT);
}

int gb_mem_alloc(uintptr_t ctx, uintptr_t *p, size_t n) {
	int r = p_ctx_set((void *)ctx);
	if (r) return r;
	unsigned long long d = 0;
	r = p_alloc(&d, n);
	*p = (uintptr_t)d;
	return r;
}

int gb_mem_free(uintptr_t ctx, uintptr_t p) {
	int r = p_ctx_set((void *)ctx);
	if (r) return r;
	return p_free((unsigned long long)p);
}
