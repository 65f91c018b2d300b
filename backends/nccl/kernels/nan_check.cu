// NaN check of a collective's input (GOCOLL_NCCL_NAN_CHECK), PyTorch's
// checkForNan: one kernel for every floating dtype, testing bit patterns so
// that no CUDA half/fp8 header is needed. It sets *flag to 1 when it finds a
// NaN; flag is device-mapped pinned host memory that the host reads once
// the stream has passed the kernel.
//
// Regenerate nan_check.ptx on the GPU machine (nvcc is not installed on the
// development machines): scripts/gen-nan-ptx.sh.
//
// kind: 0 float32, 1 float64, 2 float16, 3 bfloat16, 4 float8 e4m3fn,
// 5 float8 e5m2.

extern "C" __global__ void gocoll_nan_check(const void *p, unsigned long long n, int kind, unsigned int *flag) {
	unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
	unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
	bool found = false;
	switch (kind) {
	case 0: {
		const unsigned int *q = (const unsigned int *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fffffffu) > 0x7f800000u;
		break;
	}
	case 1: {
		const unsigned long long *q = (const unsigned long long *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
		break;
	}
	case 2: {
		const unsigned short *q = (const unsigned short *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fffu) > 0x7c00u;
		break;
	}
	case 3: {
		const unsigned short *q = (const unsigned short *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fffu) > 0x7f80u;
		break;
	}
	case 4: { // e4m3fn: no infinities, NaN is S.1111.111
		const unsigned char *q = (const unsigned char *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fu) == 0x7fu;
		break;
	}
	case 5: { // e5m2: IEEE-like, NaN is S.11111.xx with xx != 0
		const unsigned char *q = (const unsigned char *)p;
		for (; i < n && !found; i += stride) found = (q[i] & 0x7fu) > 0x7cu;
		break;
	}
	}
	if (found) atomicExch(flag, 1u);
}
