// Run-time binding of libnccl.so.2. See nccl_dl.h.
#include "nccl_dl.h"

#include <limits.h>

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

// X(symbol, required, return type, params)
#define GN_SYMS(X)                                                                                                         \
	X(ncclGetVersion, 1, ncclResult_t, (int *))                                                                               \
	X(ncclGetUniqueId, 1, ncclResult_t, (ncclUniqueId *))                                                                     \
	X(ncclCommInitRankConfig, 1, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int, gn_config *))                           \
	X(ncclCommInitRankScalable, 0, ncclResult_t, (ncclComm_t *, int, int, int, ncclUniqueId *, gn_config *))                  \
	X(ncclCommSplit, 0, ncclResult_t, (ncclComm_t, int, int, ncclComm_t *, gn_config *))                                      \
	X(ncclCommFinalize, 1, ncclResult_t, (ncclComm_t))                                                                        \
	X(ncclCommDestroy, 1, ncclResult_t, (ncclComm_t))                                                                         \
	X(ncclCommAbort, 1, ncclResult_t, (ncclComm_t))                                                                           \
	X(ncclCommGetAsyncError, 1, ncclResult_t, (ncclComm_t, ncclResult_t *))                                                   \
	X(ncclCommCount, 1, ncclResult_t, (const ncclComm_t, int *))                                                              \
	X(ncclCommCuDevice, 1, ncclResult_t, (const ncclComm_t, int *))                                                           \
	X(ncclCommUserRank, 1, ncclResult_t, (const ncclComm_t, int *))                                                           \
	X(ncclRedOpCreatePreMulSum, 1, ncclResult_t, (ncclRedOp_t *, void *, ncclDataType_t, int, ncclComm_t))                    \
	X(ncclRedOpDestroy, 1, ncclResult_t, (ncclRedOp_t, ncclComm_t))                                                           \
	X(ncclAllReduce, 1, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream))      \
	X(ncclBroadcast, 1, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream))              \
	X(ncclReduce, 1, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, CUstream))    \
	X(ncclAllGather, 1, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream))                   \
	X(ncclReduceScatter, 1, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream))  \
	X(ncclSend, 1, ncclResult_t, (const void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream))                           \
	X(ncclRecv, 1, ncclResult_t, (void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream))                                 \
	X(ncclAlltoAll, 0, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream))                    \
	X(ncclGather, 0, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream))                 \
	X(ncclScatter, 0, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream))                \
	X(ncclGroupStart, 1, ncclResult_t, (void))                                                                                \
	X(ncclGroupEnd, 1, ncclResult_t, (void))                                                                                  \
	X(ncclGetErrorString, 0, const char *, (ncclResult_t))                                                                    \
	X(ncclGetLastError, 0, const char *, (ncclComm_t))

#define GN_DECL(f, req, ret, params) static ret(*p_##f) params;
GN_SYMS(GN_DECL)

static CUresult (*c_ctxGetCurrent)(CUcontext *);
static CUresult (*c_ctxSetCurrent)(CUcontext);
static CUresult (*c_eventRecord)(CUevent, CUstream);
static CUresult (*c_streamWaitEvent)(CUstream, CUevent, unsigned);
static CUresult (*c_streamIsCapturing)(CUstream, int *);

// The symbol table that internal/dl resolves: names and whether each is
// required, in GN_SYMS order; gn_bind takes the addresses back.
enum {
#define GN_INDEX(f, req, ret, params) GN_I_##f,
	GN_SYMS(GN_INDEX) GN_NSYMS
};
#define GN_NAME(f, req, ret, params) #f,
static const char *const gn_names[] = {GN_SYMS(GN_NAME)};
#define GN_REQ(f, req, ret, params) req,
static const int gn_required[] = {GN_SYMS(GN_REQ)};

int gn_sym_count(void) { return GN_NSYMS; }
const char *gn_sym_name(int i) { return gn_names[i]; }
int gn_sym_required(int i) { return gn_required[i]; }

void gn_bind(const uintptr_t *addrs) {
#define GN_BIND(f, req, ret, params) p_##f = (ret(*) params)(void *)addrs[GN_I_##f];
	GN_SYMS(GN_BIND)
}

int gn_set_cuda(uintptr_t g, uintptr_t s, uintptr_t r, uintptr_t w, uintptr_t c) {
	c_ctxGetCurrent = (CUresult(*)(CUcontext *))(void *)g;
	c_ctxSetCurrent = (CUresult(*)(CUcontext))(void *)s;
	c_eventRecord = (CUresult(*)(CUevent, CUstream))(void *)r;
	c_streamWaitEvent = (CUresult(*)(CUstream, CUevent, unsigned))(void *)w;
	c_streamIsCapturing = (CUresult(*)(CUstream, int *))(void *)c;
	return 0;
}

int gn_version(int *v) { return p_ncclGetVersion(v); }
const char *gn_error_string(int r) { return p_ncclGetErrorString ? p_ncclGetErrorString(r) : "unknown NCCL error"; }
const char *gn_last_error(void) { return p_ncclGetLastError ? p_ncclGetLastError(NULL) : ""; }

size_t gn_config_size(void) { return sizeof(gn_config); }
size_t gn_config_offset(int f) {
	switch (f) {
	case 0: return offsetof(gn_config, size);
	case 1: return offsetof(gn_config, magic);
	case 2: return offsetof(gn_config, version);
	case 3: return offsetof(gn_config, blocking);
	case 4: return offsetof(gn_config, cgaClusterSize);
	case 5: return offsetof(gn_config, minCTAs);
	case 6: return offsetof(gn_config, maxCTAs);
	case 7: return offsetof(gn_config, netName);
	case 8: return offsetof(gn_config, splitShare);
	case 9: return offsetof(gn_config, trafficClass);
	case 10: return offsetof(gn_config, commName);
	case 11: return offsetof(gn_config, collnetEnable);
	case 12: return offsetof(gn_config, CTAPolicy);
	case 13: return offsetof(gn_config, shrinkShare);
	case 14: return offsetof(gn_config, nvlsCTAs);
	case 15: return offsetof(gn_config, nChannelsPerNetPeer);
	case 16: return offsetof(gn_config, nvlinkCentricSched);
	}
	return (size_t)-1;
}

// gn_config_init fills cfg as NCCL_CONFIG_INITIALIZER does: a zeroed
// struct is not "unset" (blocking=0 means nonblocking, minCTAs=0 is invalid).
static void gn_config_init(gn_config *c) {
	c->size = sizeof(gn_config);
	c->magic = 0xcafebeef;
	c->version = 22800;
	c->blocking = INT_MIN;
	c->cgaClusterSize = INT_MIN;
	c->minCTAs = INT_MIN;
	c->maxCTAs = INT_MIN;
	c->netName = NULL;
	c->splitShare = INT_MIN;
	c->trafficClass = INT_MIN;
	c->commName = NULL;
	c->collnetEnable = INT_MIN;
	c->CTAPolicy = INT_MIN;
	c->shrinkShare = INT_MIN;
	c->nvlsCTAs = INT_MIN;
	c->nChannelsPerNetPeer = INT_MIN;
	c->nvlinkCentricSched = INT_MIN;
}

static int gn_make_current(uintptr_t ctx) {
	if (!ctx) return 0;
	CUcontext cur = NULL;
	if (c_ctxGetCurrent(&cur) == 0 && cur == (CUcontext)ctx) return 0;
	CUresult r = c_ctxSetCurrent((CUcontext)ctx);
	return r ? GN_CUDA_ERR + r : 0;
}
#define SETCTX(c) do { int r_ = gn_make_current(c); if (r_) return r_; } while (0)

int gn_get_unique_id(uintptr_t ctx, void *id) {
	SETCTX(ctx);
	return p_ncclGetUniqueId((ncclUniqueId *)id);
}

int gn_comm_init(uintptr_t ctx, uintptr_t *comm, int nranks, void *ids, int nids, int rank, int scalable,
                 int blocking, int cga, int minCTAs, int maxCTAs, const char *netName, const char *commName) {
	SETCTX(ctx);
	gn_config cfg;
	gn_config_init(&cfg);
	cfg.blocking = blocking;
	if (cga >= 0) cfg.cgaClusterSize = cga;
	if (minCTAs > 0) cfg.minCTAs = minCTAs;
	if (maxCTAs > 0) cfg.maxCTAs = maxCTAs;
	cfg.netName = netName;
	cfg.commName = commName;
	ncclComm_t c = NULL;
	int r;
	if (scalable) {
		if (!p_ncclCommInitRankScalable) return 5; // ncclInvalidUsage
		r = p_ncclCommInitRankScalable(&c, nranks, rank, nids, (ncclUniqueId *)ids, &cfg);
	} else {
		r = p_ncclCommInitRankConfig(&c, nranks, *(ncclUniqueId *)ids, rank, &cfg);
	}
	*comm = (uintptr_t)c;
	return r;
}

int gn_comm_split(uintptr_t ctx, uintptr_t parent, int color, int key, uintptr_t *comm, int blocking,
                  const char *commName) {
	SETCTX(ctx);
	if (!p_ncclCommSplit) return 5;
	gn_config cfg;
	gn_config_init(&cfg);
	cfg.blocking = blocking;
	cfg.commName = commName;
	ncclComm_t c = NULL;
	int r = p_ncclCommSplit((ncclComm_t)parent, color, key, &c, &cfg);
	*comm = (uintptr_t)c;
	return r;
}

int gn_comm_async_error(uintptr_t comm, int *err) { return p_ncclCommGetAsyncError((ncclComm_t)comm, err); }
int gn_comm_abort(uintptr_t ctx, uintptr_t comm) { SETCTX(ctx); return p_ncclCommAbort((ncclComm_t)comm); }
int gn_comm_destroy(uintptr_t ctx, uintptr_t comm) { SETCTX(ctx); return p_ncclCommDestroy((ncclComm_t)comm); }
int gn_comm_finalize(uintptr_t ctx, uintptr_t comm) { SETCTX(ctx); return p_ncclCommFinalize((ncclComm_t)comm); }
int gn_comm_info(uintptr_t comm, int *count, int *dev, int *rank) {
	int r = p_ncclCommCount((ncclComm_t)comm, count);
	if (r) return r;
	r = p_ncclCommCuDevice((ncclComm_t)comm, dev);
	if (r) return r;
	return p_ncclCommUserRank((ncclComm_t)comm, rank);
}

int gn_group_start(void) { return p_ncclGroupStart(); }
int gn_group_end(void) { return p_ncclGroupEnd(); }

int gn_pre(uintptr_t ctx, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv, uintptr_t startEv) {
	SETCTX(ctx);
	CUresult cr;
	if (syncEv) {
		if ((cr = c_eventRecord((CUevent)syncEv, (CUstream)cur))) return GN_CUDA_ERR + cr;
		if ((cr = c_streamWaitEvent((CUstream)nstream, (CUevent)syncEv, 0))) return GN_CUDA_ERR + cr;
	}
	if (startEv && (cr = c_eventRecord((CUevent)startEv, (CUstream)nstream))) return GN_CUDA_ERR + cr;
	int st = 0;
	if (cur && c_streamIsCapturing((CUstream)cur, &st) == 0 && st != 0) return GN_CAPTURING;
	return 0;
}

int gn_post(uintptr_t ctx, uintptr_t nstream, uintptr_t endEv) {
	SETCTX(ctx);
	CUresult cr;
	if (endEv && (cr = c_eventRecord((CUevent)endEv, (CUstream)nstream))) return GN_CUDA_ERR + cr;
	return 0;
}

static int gn_call(ncclComm_t comm, CUstream s, int kind, const void *send, void *recv, size_t count, int dt,
                   int op, uint64_t scalar, int root) {
	ncclRedOp_t rop = op;
	int premul = op < 0;
	int r;
	if (premul && (kind == GN_ALLREDUCE || kind == GN_REDUCE || kind == GN_REDUCESCATTER)) {
		uint64_t buf = scalar;
		r = p_ncclRedOpCreatePreMulSum(&rop, &buf, dt, 1 /* ncclScalarHostImmediate */, comm);
		if (r) return r;
	}
	switch (kind) {
	case GN_ALLREDUCE: r = p_ncclAllReduce(send, recv, count, dt, rop, comm, s); break;
	case GN_BROADCAST: r = p_ncclBroadcast(send, recv, count, dt, root, comm, s); break;
	case GN_REDUCE: r = p_ncclReduce(send, recv, count, dt, rop, root, comm, s); break;
	case GN_ALLGATHER: r = p_ncclAllGather(send, recv, count, dt, comm, s); break;
	case GN_REDUCESCATTER: r = p_ncclReduceScatter(send, recv, count, dt, rop, comm, s); break;
	case GN_SEND: r = p_ncclSend(send, count, dt, root, comm, s); break;
	case GN_RECV: r = p_ncclRecv(recv, count, dt, root, comm, s); break;
	case GN_ALLTOALL: r = p_ncclAlltoAll ? p_ncclAlltoAll(send, recv, count, dt, comm, s) : 5; break;
	case GN_GATHER: r = p_ncclGather ? p_ncclGather(send, recv, count, dt, root, comm, s) : 5; break;
	case GN_SCATTER: r = p_ncclScatter ? p_ncclScatter(send, recv, count, dt, root, comm, s) : 5; break;
	default: r = 4; // ncclInvalidArgument
	}
	if (premul && rop >= 5) p_ncclRedOpDestroy(rop, comm);
	return r;
}

int gn_issue(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv,
             uintptr_t startEv, uintptr_t endEv, int kind, uintptr_t send, uintptr_t recv, size_t count,
             int dt, int op, uint64_t scalar, int root) {
	int pre = gn_pre(ctx, nstream, cur, syncEv, startEv);
	if (pre & ~GN_CAPTURING) return pre;
	int r = gn_call((ncclComm_t)comm, (CUstream)nstream, kind, (const void *)send, (void *)recv, count, dt, op,
	                scalar, root);
	// ncclInProgress (7): a nonblocking communicator is still launching; the
	// caller polls it and records the end event afterwards (gn_post).
	if (r) return r | pre;
	if (endEv) {
		CUresult cr = c_eventRecord((CUevent)endEv, (CUstream)nstream);
		if (cr) return GN_CUDA_ERR + cr;
	}
	return r | pre;
}

// gn_issue_nosync is gn_call for use inside a group (no events).
int gn_issue_nosync(uintptr_t comm, uintptr_t nstream, int kind, uintptr_t send, uintptr_t recv, size_t count,
                    int dt, int op, uint64_t scalar, int root) {
	return gn_call((ncclComm_t)comm, (CUstream)nstream, kind, (const void *)send, (void *)recv, count, dt, op,
	               scalar, root);
}

// gn_bench_raw is the raw-NCCL baseline for benchmarks: iters back-to-back
// ncclAllReduce calls from C on stream s, no events, no Go. It returns the
// host nanoseconds spent issuing them.
#include <time.h>
long long gn_bench_raw(uintptr_t ctx, uintptr_t comm, uintptr_t s, uintptr_t buf, size_t count, int dt, int iters) {
	if (gn_make_current(ctx)) return -1;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < iters; i++) {
		if (p_ncclAllReduce((void *)buf, (void *)buf, count, dt, 0, (ncclComm_t)comm, (CUstream)s)) return -2;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}

long long gn_bench_floor(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv, uintptr_t endEv,
                         uintptr_t buf, size_t count, int dt, int iters) {
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < iters; i++) {
		if (gn_make_current(ctx)) return -1;
		if (c_eventRecord((CUevent)syncEv, (CUstream)cur)) return -3;
		if (c_streamWaitEvent((CUstream)nstream, (CUevent)syncEv, 0)) return -3;
		int st = 0;
		if (c_streamIsCapturing((CUstream)cur, &st)) return -3;
		if (p_ncclAllReduce((void *)buf, (void *)buf, count, dt, 0, (ncclComm_t)comm, (CUstream)nstream)) return -2;
		if (c_eventRecord((CUevent)endEv, (CUstream)nstream)) return -3;
		if (gn_make_current(ctx)) return -1;
		if (c_streamWaitEvent((CUstream)cur, (CUevent)endEv, 0)) return -3;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}

long long gn_bench_floor_cur_evs(uintptr_t ctx, uintptr_t comm, uintptr_t cur, const uintptr_t *evs, int nev, int *next,
                                 uintptr_t buf, size_t count, int dt, int iters) {
	struct timespec a, b;
	int k = *next;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < iters; i++) {
		if (gn_make_current(ctx)) return -1;
		int st = 0;
		if (c_streamIsCapturing((CUstream)cur, &st)) return -3;
		if (p_ncclAllReduce((void *)buf, (void *)buf, count, dt, 0, (ncclComm_t)comm, (CUstream)cur)) return -2;
		if (c_eventRecord((CUevent)evs[k], (CUstream)cur)) return -3;
		if (++k == nev) k = 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	*next = k;
	return (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}

long long gn_bench_floor_cur(uintptr_t ctx, uintptr_t comm, uintptr_t cur, uintptr_t endEv, uintptr_t buf, size_t count,
                             int dt, int iters) {
	int next = 0;
	return gn_bench_floor_cur_evs(ctx, comm, cur, &endEv, 1, &next, buf, count, dt, iters);
}

// gn_bench_calls times each driver call of the floor loop on its own: the
// same calls in the same order as gn_bench_floor, with a clock read
// between each two, summing each call's nanoseconds into ns[GN_SLOTS] (the
// clock's own cost goes into ns[GN_S_CLOCK], one empty read pair per
// iteration, to subtract). mode 0 is the backend's design (one sync event,
// re-recorded each op); mode 1 records a different sync event each op
// (syncEvs[i % nsync]), to see whether re-recording an event that a stream
// still waits on costs more; mode 2 orders the streams through 32-bit
// stream memory operations on words of device-mapped host memory instead
// of events (cuStreamWriteValue32 on the producer, cuStreamWaitValue32 GEQ
// on the consumer; the "query" is then a host load of the end word), the
// alternative design. gn_bench_calls_syms passes the extra entry points.
static CUresult (*c_eventQuery)(CUevent);
static CUresult (*c_writeValue32)(CUstream, unsigned long long, unsigned, unsigned);
static CUresult (*c_waitValue32)(CUstream, unsigned long long, unsigned, unsigned);

void gn_bench_calls_syms(uintptr_t q, uintptr_t wr, uintptr_t wt) {
	c_eventQuery = (CUresult(*)(CUevent))(void *)q;
	c_writeValue32 = (CUresult(*)(CUstream, unsigned long long, unsigned, unsigned))(void *)wr;
	c_waitValue32 = (CUresult(*)(CUstream, unsigned long long, unsigned, unsigned))(void *)wt;
}

static inline long long gn_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int gn_bench_calls(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, const uintptr_t *syncEvs, int nsync,
                   uintptr_t endEv, uintptr_t semA, uintptr_t semB, volatile unsigned *hostB, uintptr_t buf,
                   size_t count, int dt, int iters, int mode, unsigned base, long long *ns) {
	for (int i = 0; i < iters; i++) {
		unsigned v = base + (unsigned)i + 1;
		CUevent sync = (CUevent)syncEvs[mode == 1 ? i % nsync : 0];
		CUresult cr;
		int st = 0;
		long long t0 = gn_now(), t1;
		t1 = gn_now(); ns[GN_S_CLOCK] += t1 - t0; t0 = t1;
		if (gn_make_current(ctx)) return -1;
		t1 = gn_now(); ns[GN_S_CTX1] += t1 - t0; t0 = t1;
		cr = mode == 2 ? c_writeValue32((CUstream)cur, semA, v, 0) : c_eventRecord(sync, (CUstream)cur);
		if (cr) return -3;
		t1 = gn_now(); ns[GN_S_REC_SYNC] += t1 - t0; t0 = t1;
		cr = mode == 2 ? c_waitValue32((CUstream)nstream, semA, v, 0) : c_streamWaitEvent((CUstream)nstream, sync, 0);
		if (cr) return -3;
		t1 = gn_now(); ns[GN_S_WAIT_SYNC] += t1 - t0; t0 = t1;
		if (c_streamIsCapturing((CUstream)cur, &st)) return -3;
		t1 = gn_now(); ns[GN_S_CAPQ] += t1 - t0; t0 = t1;
		if (p_ncclAllReduce((void *)buf, (void *)buf, count, dt, 0, (ncclComm_t)comm, (CUstream)nstream)) return -2;
		t1 = gn_now(); ns[GN_S_NCCL] += t1 - t0; t0 = t1;
		cr = mode == 2 ? c_writeValue32((CUstream)nstream, semB, v, 0) : c_eventRecord((CUevent)endEv, (CUstream)nstream);
		if (cr) return -3;
		t1 = gn_now(); ns[GN_S_REC_END] += t1 - t0; t0 = t1;
		if (gn_make_current(ctx)) return -1;
		t1 = gn_now(); ns[GN_S_CTX2] += t1 - t0; t0 = t1;
		cr = mode == 2 ? c_waitValue32((CUstream)cur, semB, v, 0) : c_streamWaitEvent((CUstream)cur, (CUevent)endEv, 0);
		if (cr) return -3;
		t1 = gn_now(); ns[GN_S_WAIT_END] += t1 - t0; t0 = t1;
		// The watchdog's completion check of the newest work.
		if (mode == 2) {
			(void)*hostB;
		} else {
			cr = c_eventQuery((CUevent)endEv);
			if (cr != 0 && cr != 600) return -3; // 600: CUDA_ERROR_NOT_READY
		}
		t1 = gn_now(); ns[GN_S_QUERY] += t1 - t0;
	}
	return 0;
}
