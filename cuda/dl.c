// Run-time binding of libcuda.so.1. See dl.h.
#include "dl.h"

// X(field, symbol, required, return, params)
#define GC_SYMS(X)                                                                        \
	X(cuInit, "cuInit", 1, CUresult, (unsigned))                                          \
	X(cuDriverGetVersion, "cuDriverGetVersion", 1, CUresult, (int *))                     \
	X(cuGetErrorName, "cuGetErrorName", 1, CUresult, (CUresult, const char **))           \
	X(cuGetErrorString, "cuGetErrorString", 1, CUresult, (CUresult, const char **))       \
	X(cuDeviceGetCount, "cuDeviceGetCount", 1, CUresult, (int *))                         \
	X(cuDeviceGet, "cuDeviceGet", 1, CUresult, (CUdevice *, int))                         \
	X(cuDeviceGetName, "cuDeviceGetName", 1, CUresult, (char *, int, CUdevice))           \
	X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 1, CUresult, (char *, int, CUdevice))   \
	X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 1, CUresult, (int *, int, CUdevice))  \
	X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", 1, CUresult, (size_t *, CUdevice))         \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1, CUresult, (CUcontext *, CUdevice)) \
	X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 1, CUresult, (CUdevice)) \
	X(cuCtxGetCurrent, "cuCtxGetCurrent", 1, CUresult, (CUcontext *))                     \
	X(cuCtxSetCurrent, "cuCtxSetCurrent", 1, CUresult, (CUcontext))                       \
	X(cuCtxSynchronize, "cuCtxSynchronize", 1, CUresult, (void))                          \
	X(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", 1, CUresult, (int *, int *)) \
	X(cuMemGetInfo, "cuMemGetInfo_v2", 1, CUresult, (size_t *, size_t *))                 \
	X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 1, CUresult, (CUstream *, unsigned, int)) \
	X(cuStreamDestroy, "cuStreamDestroy_v2", 1, CUresult, (CUstream))                     \
	X(cuStreamQuery, "cuStreamQuery", 1, CUresult, (CUstream))                            \
	X(cuStreamSynchronize, "cuStreamSynchronize", 1, CUresult, (CUstream))                \
	X(cuStreamWaitEvent, "cuStreamWaitEvent", 1, CUresult, (CUstream, CUevent, unsigned)) \
	X(cuStreamGetPriority, "cuStreamGetPriority", 1, CUresult, (CUstream, int *))         \
	X(cuStreamWaitValue32, "cuStreamWaitValue32_v2", 0, CUresult, (CUstream, CUdeviceptr, uint32_t, unsigned)) \
	X(cuStreamWriteValue32, "cuStreamWriteValue32_v2", 0, CUresult, (CUstream, CUdeviceptr, uint32_t, unsigned)) \
	X(cuStreamIsCapturing, "cuStreamIsCapturing", 1, CUresult, (CUstream, int *))         \
	X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", 0, CUresult, (CUstream, int))      \
	X(cuStreamEndCapture, "cuStreamEndCapture", 0, CUresult, (CUstream, CUgraph *))       \
	X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 0, CUresult, (CUgraphExec *, CUgraph, unsigned long long)) \
	X(cuGraphLaunch, "cuGraphLaunch", 0, CUresult, (CUgraphExec, CUstream))               \
	X(cuGraphExecDestroy, "cuGraphExecDestroy", 0, CUresult, (CUgraphExec))               \
	X(cuGraphDestroy, "cuGraphDestroy", 0, CUresult, (CUgraph))                           \
	X(cuEventCreate, "cuEventCreate", 1, CUresult, (CUevent *, unsigned))                 \
	X(cuEventDestroy, "cuEventDestroy_v2", 1, CUresult, (CUevent))                        \
	X(cuEventRecord, "cuEventRecord", 1, CUresult, (CUevent, CUstream))                   \
	X(cuEventQuery, "cuEventQuery", 1, CUresult, (CUevent))                               \
	X(cuEventSynchronize, "cuEventSynchronize", 1, CUresult, (CUevent))                   \
	X(cuEventElapsedTime, "cuEventElapsedTime_v2", 0, CUresult, (float *, CUevent, CUevent)) \
	X(cuEventElapsedTimeV1, "cuEventElapsedTime", 0, CUresult, (float *, CUevent, CUevent)) \
	X(cuMemAllocAsync, "cuMemAllocAsync", 0, CUresult, (CUdeviceptr *, size_t, CUstream)) \
	X(cuMemFreeAsync, "cuMemFreeAsync", 0, CUresult, (CUdeviceptr, CUstream))             \
	X(cuMemAlloc, "cuMemAlloc_v2", 1, CUresult, (CUdeviceptr *, size_t))                  \
	X(cuMemFree, "cuMemFree_v2", 1, CUresult, (CUdeviceptr))                              \
	X(cuMemHostAlloc, "cuMemHostAlloc", 1, CUresult, (void **, size_t, unsigned))         \
	X(cuMemFreeHost, "cuMemFreeHost", 1, CUresult, (void *))                              \
	X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", 1, CUresult, (CUdeviceptr *, void *, unsigned)) \
	X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", 1, CUresult, (CUdeviceptr, const void *, size_t, CUstream)) \
	X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", 1, CUresult, (void *, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", 1, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
	X(cuMemsetD8Async, "cuMemsetD8Async", 1, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream)) \
	X(cuMemsetD32Async, "cuMemsetD32Async", 1, CUresult, (CUdeviceptr, unsigned int, size_t, CUstream)) \
	X(cuPointerGetAttribute, "cuPointerGetAttribute", 1, CUresult, (void *, int, CUdeviceptr)) \
	X(cuModuleLoadData, "cuModuleLoadData", 0, CUresult, (void **, const void *))         \
	X(cuModuleUnload, "cuModuleUnload", 0, CUresult, (void *))                            \
	X(cuModuleGetFunction, "cuModuleGetFunction", 0, CUresult, (void **, void *, const char *)) \
	X(cuLaunchKernel, "cuLaunchKernel", 0, CUresult, (void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **))

#define GC_DECL(f, s, req, ret, params) static ret(*p_##f) params;
GC_SYMS(GC_DECL)

// The symbol table that internal/dl resolves: names and whether each is
// required, in GC_SYMS order; gc_bind takes the addresses back.
enum {
#define GC_INDEX(f, s, req, ret, params) GC_I_##f,
	GC_SYMS(GC_INDEX) GC_NSYMS
};
#define GC_NAME(f, s, req, ret, params) s,
static const char *const gc_names[] = {GC_SYMS(GC_NAME)};
#define GC_REQ(f, s, req, ret, params) req,
static const int gc_required[] = {GC_SYMS(GC_REQ)};

int gc_sym_count(void) { return GC_NSYMS; }
const char *gc_sym_name(int i) { return gc_names[i]; }
int gc_sym_required(int i) { return gc_required[i]; }

void gc_bind(const uintptr_t *addrs) {
#define GC_BIND(f, s, req, ret, params) p_##f = (ret(*) params)(void *)addrs[GC_I_##f];
	GC_SYMS(GC_BIND)
	if (!p_cuEventElapsedTime) p_cuEventElapsedTime = p_cuEventElapsedTimeV1;
}

CUresult gc_init(void) { return p_cuInit(0); }

const char *gc_error_name(CUresult r) {
	const char *s = NULL;
	if (p_cuGetErrorName) p_cuGetErrorName(r, &s);
	return s ? s : "CUDA_ERROR_UNKNOWN_CODE";
}
const char *gc_error_string(CUresult r) {
	const char *s = NULL;
	if (p_cuGetErrorString) p_cuGetErrorString(r, &s);
	return s ? s : "unknown error";
}

// 98 = CUDA_ERROR_NOT_FOUND-like "not supported by this driver": we use 801
// (CUDA_ERROR_NOT_SUPPORTED) for optional entry points that are missing.
#define GC_NEED(f) if (!p_##f) return 801

CUresult gc_make_current(uintptr_t ctx) {
	if (!ctx) return 0;
	CUcontext cur = NULL;
	if (p_cuCtxGetCurrent(&cur) == 0 && cur == (CUcontext)ctx) return 0;
	return p_cuCtxSetCurrent((CUcontext)ctx);
}
#define SETCTX(c) do { CUresult r_ = gc_make_current(c); if (r_) return r_; } while (0)

CUresult gc_driver_version(int *v) { return p_cuDriverGetVersion(v); }
CUresult gc_device_count(int *n) { return p_cuDeviceGetCount(n); }
CUresult gc_device_get(CUdevice *d, int o) { return p_cuDeviceGet(d, o); }
CUresult gc_device_name(char *b, int l, CUdevice d) { return p_cuDeviceGetName(b, l, d); }
CUresult gc_device_pci(char *b, int l, CUdevice d) { return p_cuDeviceGetPCIBusId(b, l, d); }
CUresult gc_device_attr(int *v, int a, CUdevice d) { return p_cuDeviceGetAttribute(v, a, d); }
CUresult gc_device_total_mem(size_t *v, CUdevice d) { return p_cuDeviceTotalMem(v, d); }
CUresult gc_primary_retain(uintptr_t *ctx, CUdevice d) {
	CUcontext c = NULL;
	CUresult r = p_cuDevicePrimaryCtxRetain(&c, d);
	*ctx = (uintptr_t)c;
	return r;
}
CUresult gc_primary_release(CUdevice d) { return p_cuDevicePrimaryCtxRelease(d); }

CUresult gc_ctx_sync(uintptr_t ctx) { SETCTX(ctx); return p_cuCtxSynchronize(); }
CUresult gc_mem_info(uintptr_t ctx, size_t *f, size_t *t) { SETCTX(ctx); return p_cuMemGetInfo(f, t); }
CUresult gc_priority_range(uintptr_t ctx, int *l, int *g) { SETCTX(ctx); return p_cuCtxGetStreamPriorityRange(l, g); }

CUresult gc_stream_create(uintptr_t ctx, uintptr_t *s, unsigned flags, int prio) {
	SETCTX(ctx);
	CUstream st = NULL;
	CUresult r = p_cuStreamCreateWithPriority(&st, flags, prio);
	*s = (uintptr_t)st;
	return r;
}
CUresult gc_stream_destroy(uintptr_t ctx, uintptr_t s) { SETCTX(ctx); return p_cuStreamDestroy((CUstream)s); }
CUresult gc_stream_query(uintptr_t ctx, uintptr_t s) { SETCTX(ctx); return p_cuStreamQuery((CUstream)s); }
CUresult gc_stream_sync(uintptr_t ctx, uintptr_t s) { SETCTX(ctx); return p_cuStreamSynchronize((CUstream)s); }
CUresult gc_stream_wait_event(uintptr_t ctx, uintptr_t s, uintptr_t e) {
	SETCTX(ctx);
	return p_cuStreamWaitEvent((CUstream)s, (CUevent)e, 0);
}
CUresult gc_stream_priority(uintptr_t ctx, uintptr_t s, int *p) { SETCTX(ctx); return p_cuStreamGetPriority((CUstream)s, p); }
CUresult gc_stream_wait_value32(uintptr_t ctx, uintptr_t s, CUdeviceptr a, uint32_t v, unsigned f) {
	GC_NEED(cuStreamWaitValue32);
	SETCTX(ctx);
	return p_cuStreamWaitValue32((CUstream)s, a, v, f);
}
CUresult gc_stream_write_value32(uintptr_t ctx, uintptr_t s, CUdeviceptr a, uint32_t v, unsigned f) {
	GC_NEED(cuStreamWriteValue32);
	SETCTX(ctx);
	return p_cuStreamWriteValue32((CUstream)s, a, v, f);
}
CUresult gc_stream_is_capturing(uintptr_t ctx, uintptr_t s, int *st) { SETCTX(ctx); return p_cuStreamIsCapturing((CUstream)s, st); }
CUresult gc_stream_begin_capture(uintptr_t ctx, uintptr_t s, int mode) {
	GC_NEED(cuStreamBeginCapture);
	SETCTX(ctx);
	return p_cuStreamBeginCapture((CUstream)s, mode);
}
CUresult gc_stream_end_capture(uintptr_t ctx, uintptr_t s, uintptr_t *g) {
	GC_NEED(cuStreamEndCapture);
	SETCTX(ctx);
	CUgraph gr = NULL;
	CUresult r = p_cuStreamEndCapture((CUstream)s, &gr);
	*g = (uintptr_t)gr;
	return r;
}
CUresult gc_graph_instantiate(uintptr_t ctx, uintptr_t *exec, uintptr_t g) {
	GC_NEED(cuGraphInstantiateWithFlags);
	SETCTX(ctx);
	CUgraphExec e = NULL;
	CUresult r = p_cuGraphInstantiateWithFlags(&e, (CUgraph)g, 0);
	*exec = (uintptr_t)e;
	return r;
}
CUresult gc_graph_launch(uintptr_t ctx, uintptr_t exec, uintptr_t s) {
	GC_NEED(cuGraphLaunch);
	SETCTX(ctx);
	return p_cuGraphLaunch((CUgraphExec)exec, (CUstream)s);
}
CUresult gc_graph_exec_destroy(uintptr_t ctx, uintptr_t exec) {
	GC_NEED(cuGraphExecDestroy);
	SETCTX(ctx);
	return p_cuGraphExecDestroy((CUgraphExec)exec);
}
CUresult gc_graph_destroy(uintptr_t ctx, uintptr_t g) {
	GC_NEED(cuGraphDestroy);
	SETCTX(ctx);
	return p_cuGraphDestroy((CUgraph)g);
}

CUresult gc_event_create(uintptr_t ctx, uintptr_t *e, unsigned flags) {
	SETCTX(ctx);
	CUevent ev = NULL;
	CUresult r = p_cuEventCreate(&ev, flags);
	*e = (uintptr_t)ev;
	return r;
}
CUresult gc_event_destroy(uintptr_t ctx, uintptr_t e) { SETCTX(ctx); return p_cuEventDestroy((CUevent)e); }
CUresult gc_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s) { SETCTX(ctx); return p_cuEventRecord((CUevent)e, (CUstream)s); }
CUresult gc_event_query(uintptr_t ctx, uintptr_t e) { SETCTX(ctx); return p_cuEventQuery((CUevent)e); }
CUresult gc_event_sync(uintptr_t ctx, uintptr_t e) { SETCTX(ctx); return p_cuEventSynchronize((CUevent)e); }
CUresult gc_event_elapsed(uintptr_t ctx, float *ms, uintptr_t a, uintptr_t b) {
	GC_NEED(cuEventElapsedTime);
	SETCTX(ctx);
	return p_cuEventElapsedTime(ms, (CUevent)a, (CUevent)b);
}
CUresult gc_record_wait(uintptr_t ctx, uintptr_t e, uintptr_t from, uintptr_t to) {
	SETCTX(ctx);
	CUresult r = p_cuEventRecord((CUevent)e, (CUstream)from);
	if (r) return r;
	return p_cuStreamWaitEvent((CUstream)to, (CUevent)e, 0);
}

CUresult gc_mem_alloc_async(uintptr_t ctx, CUdeviceptr *p, size_t n, uintptr_t s) {
	GC_NEED(cuMemAllocAsync);
	SETCTX(ctx);
	return p_cuMemAllocAsync(p, n, (CUstream)s);
}
CUresult gc_mem_free_async(uintptr_t ctx, CUdeviceptr p, uintptr_t s) {
	GC_NEED(cuMemFreeAsync);
	SETCTX(ctx);
	return p_cuMemFreeAsync(p, (CUstream)s);
}
CUresult gc_mem_alloc(uintptr_t ctx, CUdeviceptr *p, size_t n) { SETCTX(ctx); return p_cuMemAlloc(p, n); }
CUresult gc_mem_free(uintptr_t ctx, CUdeviceptr p) { SETCTX(ctx); return p_cuMemFree(p); }
CUresult gc_host_alloc(uintptr_t ctx, void **p, size_t n, unsigned flags) { SETCTX(ctx); return p_cuMemHostAlloc(p, n, flags); }
CUresult gc_host_free(uintptr_t ctx, void *p) { SETCTX(ctx); return p_cuMemFreeHost(p); }
CUresult gc_host_device_ptr(uintptr_t ctx, CUdeviceptr *d, void *p) { SETCTX(ctx); return p_cuMemHostGetDevicePointer(d, p, 0); }
CUresult gc_memcpy_htod_async(uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n, uintptr_t s) {
	SETCTX(ctx);
	return p_cuMemcpyHtoDAsync(dst, src, n, (CUstream)s);
}
CUresult gc_memcpy_dtoh_async(uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s) {
	SETCTX(ctx);
	return p_cuMemcpyDtoHAsync(dst, src, n, (CUstream)s);
}
CUresult gc_memcpy_dtod_async(uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, uintptr_t s) {
	SETCTX(ctx);
	return p_cuMemcpyDtoDAsync(dst, src, n, (CUstream)s);
}
CUresult gc_memset_d8_async(uintptr_t ctx, CUdeviceptr p, unsigned char v, size_t n, uintptr_t s) {
	SETCTX(ctx);
	return p_cuMemsetD8Async(p, v, n, (CUstream)s);
}
CUresult gc_memset_d32_async(uintptr_t ctx, CUdeviceptr p, unsigned int v, size_t n, uintptr_t s) {
	SETCTX(ctx);
	return p_cuMemsetD32Async(p, v, n, (CUstream)s);
}
// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CUresult gc_pointer_device(uintptr_t ctx, int *ordinal, CUdeviceptr p) {
	SETCTX(ctx);
	return p_cuPointerGetAttribute(ordinal, 9, p);
}

CUresult gc_event_create_n(uintptr_t ctx, uintptr_t *out, int n, unsigned flags) {
	SETCTX(ctx);
	for (int i = 0; i < n; i++) {
		CUevent ev = NULL;
		CUresult r = p_cuEventCreate(&ev, flags);
		if (r) {
			for (int j = 0; j < i; j++) p_cuEventDestroy((CUevent)out[j]);
			return r;
		}
		out[i] = (uintptr_t)ev;
	}
	return 0;
}

CUresult gc_module_load(uintptr_t ctx, uintptr_t *mod, const void *image) {
	GC_NEED(cuModuleLoadData);
	SETCTX(ctx);
	void *m = NULL;
	CUresult r = p_cuModuleLoadData(&m, image);
	*mod = (uintptr_t)m;
	return r;
}
CUresult gc_module_unload(uintptr_t ctx, uintptr_t mod) {
	GC_NEED(cuModuleUnload);
	SETCTX(ctx);
	return p_cuModuleUnload((void *)mod);
}
CUresult gc_module_function(uintptr_t ctx, uintptr_t *fn, uintptr_t mod, const char *name) {
	GC_NEED(cuModuleGetFunction);
	SETCTX(ctx);
	void *f = NULL;
	CUresult r = p_cuModuleGetFunction(&f, (void *)mod, name);
	*fn = (uintptr_t)f;
	return r;
}
// gc_launch launches fn with nargs parameters packed in args at offsets;
// cuLaunchKernel copies them before it returns.
CUresult gc_launch(uintptr_t ctx, uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, uintptr_t s, void *args, const size_t *offsets, int nargs) {
	GC_NEED(cuLaunchKernel);
	SETCTX(ctx);
	void *params[16];
	if (nargs > 16) return 1; // CUDA_ERROR_INVALID_VALUE
	for (int i = 0; i < nargs; i++) params[i] = (char *)args + offsets[i];
	return p_cuLaunchKernel((void *)fn, gx, gy, gz, bx, by, bz, shmem, (CUstream)s, params, NULL);
}
