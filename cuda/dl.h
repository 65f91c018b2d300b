// Hand-written declarations of the CUDA driver API subset that gocoll uses,
// from reference/nccl-cuda-abi.md (no NVIDIA header is needed to build).
// The library is opened at run time (internal/dl); every entry point is called through a
// trampoline that first makes the caller's primary context current, because
// a Go goroutine can move to another OS thread between two cgo calls.
#ifndef GOCOLL_CUDA_DL_H
#define GOCOLL_CUDA_DL_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

// The entry points gocoll binds, for internal/dl to resolve: gc_sym_count
// of them, each with its name and whether it is required. gc_bind takes
// their addresses in that order (0 for a missing optional one); gc_init
// then calls cuInit(0).
int gc_sym_count(void);
const char *gc_sym_name(int i);
int gc_sym_required(int i);
void gc_bind(const uintptr_t *addrs);
CUresult gc_init(void);

const char *gc_error_name(CUresult r);
const char *gc_error_string(CUresult r);

CUresult gc_driver_version(int *v);
CUresult gc_device_count(int *n);
CUresult gc_device_get(CUdevice *d, int ordinal);
CUresult gc_device_name(char *buf, int len, CUdevice d);
CUresult gc_device_pci(char *buf, int len, CUdevice d);
CUresult gc_device_attr(int *v, int attr, CUdevice d);
CUresult gc_device_total_mem(size_t *v, CUdevice d);
CUresult gc_primary_retain(uintptr_t *ctx, CUdevice d);
CUresult gc_primary_release(CUdevice d);

CUresult gc_ctx_sync(uintptr_t ctx);
CUresult gc_mem_info(uintptr_t ctx, size_t *free_, size_t *total);
CUresult gc_priority_range(uintptr_t ctx, int *least, int *greatest);

CUresult gc_stream_create(uintptr_t ctx, uintptr_t *s, unsigned flags, int prio);
CUresult gc_stream_destroy(uintptr_t ctx, uintptr_t s);
CUresult gc_stream_query(uintptr_t ctx, uintptr_t s);
CUresult gc_stream_sync(uintptr_t ctx, uintptr_t s);
CUresult gc_stream_wait_event(uintptr_t ctx, uintptr_t s, uintptr_t e);
CUresult gc_stream_priority(uintptr_t ctx, uintptr_t s, int *p);
CUresult gc_stream_wait_value32(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint32_t v, unsigned flags);
CUresult gc_stream_write_value32(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint32_t v, unsigned flags);
CUresult gc_stream_is_capturing(uintptr_t ctx, uintptr_t s, int *status);
CUresult gc_stream_begin_capture(uintptr_t ctx, uintptr_t s, int mode);
CUresult gc_stream_end_capture(uintptr_t ctx, uintptr_t s, uintptr_t *g);
CUresult gc_graph_instantiate(uintptr_t ctx, uintptr_t *exec, uintptr_t g);
CUresult gc_graph_launch(uintptr_t ctx, uintptr_t exec, uintptr_t s);
CUresult gc_graph_exec_destroy(uintptr_t ctx, uintptr_t exec);
CUresult gc_graph_destroy(uintptr_t ctx, uintptr_t g);

CUresult gc_event_create(uintptr_t ctx, uintptr_t *e, unsigned flags);
CUresult gc_event_destroy(uintptr_t ctx, uintptr_t e);
// gc_event_create_n creates n events into out; on failure none are kept.
CUresult gc_event_create_n(uintptr_t ctx, uintptr_t *out, int n, unsigned flags);
CUresult gc_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s);
CUresult gc_event_query(uintptr_t ctx, uintptr_t e);
CUresult gc_event_sync(uintptr_t ctx, uintptr_t e);
CUresult gc_event_elapsed(uintptr_t ctx, float *ms, uintptr_t start, uintptr_t end);
// gc_record_wait records e on from and makes to wait on it: one crossing.
CUresult gc_record_wait(uintptr_t ctx, uintptr_t e, uintptr_t from, uintptr_t to);

CUresult gc_mem_alloc_async(uintptr_t ctx, CUdeviceptr *p, size_t n, uintptr_t s);
CUresult gc_mem_free_async(uintptr_t ctx, CUdeviceptr p, uintptr_t s);
CUresult gc_mem_alloc(uintptr_t ctx, CUdeviceptr *p, size_t n);
CUresult gc_mem_free(uintptr_t ctx, CUdeviceptr p);
CUresult gc_host_alloc(uintptr_t ctx, void **p, size_t n, unsigned flags);
CUresult gc_host_free(uintptr_t ctx, void *p);
CUresult gc_host_device_ptr(uintptr_t ctx, CUdeviceptr *d, void *p);
CUresult gc_memcpy_htod_async(uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n, uintptr_t s);
CUresult gc_memcpy_dtoh_async(uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s);
CUresult gc_memcpy_dtod_async(uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, uintptr_t s);
CUresult gc_memset_d8_async(uintptr_t ctx, CUdeviceptr p, unsigned char v, size_t n, uintptr_t s);
CUresult gc_memset_d32_async(uintptr_t ctx, CUdeviceptr p, unsigned int v, size_t n, uintptr_t s);
CUresult gc_pointer_device(uintptr_t ctx, int *ordinal, CUdeviceptr p);

CUresult gc_module_load(uintptr_t ctx, uintptr_t *mod, const void *image);
CUresult gc_module_unload(uintptr_t ctx, uintptr_t mod);
CUresult gc_module_function(uintptr_t ctx, uintptr_t *fn, uintptr_t mod, const char *name);
CUresult gc_launch(uintptr_t ctx, uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, uintptr_t s, void *args, const size_t *offsets, int nargs);

// gc_make_current makes ctx current on the calling thread (for C code in
// other packages, such as the NCCL backend, that shares these pointers).
CUresult gc_make_current(uintptr_t ctx);

#endif
