// Hand-written declarations of the NCCL 2.28 API subset gocoll uses, from
// reference/nccl-cuda-abi.md; abi_test.go checks them against nccl.h where
// that header exists. libnccl.so.2 is opened at run time (internal/dl).
#ifndef GOCOLL_NCCL_DL_H
#define GOCOLL_NCCL_DL_H

#include <stddef.h>
#include <stdint.h>

typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;

// ncclConfig_t as of NCCL 2.28 (struct ncclConfig_v22800, 80 bytes).
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
	int trafficClass;
	const char *commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
} gn_config;

// Op kinds of gn_issue.
enum {
	GN_ALLREDUCE = 0,
	GN_BROADCAST = 1,
	GN_REDUCE = 2,
	GN_ALLGATHER = 3,
	GN_REDUCESCATTER = 4,
	GN_SEND = 5,
	GN_RECV = 6,
	GN_ALLTOALL = 7,
	GN_GATHER = 8,
	GN_SCATTER = 9,
};

// gn_issue's result: 0, an ncclResult_t, or GN_CUDA_ERR + CUresult; with
// GN_CAPTURING or'ed in when the current stream is being captured.
#define GN_CUDA_ERR 100000
#define GN_CAPTURING (1 << 30)

// The entry points gocoll binds, for internal/dl to resolve: gn_sym_count
// of them, each with its name and whether it is required. gn_bind takes
// their addresses in that order (0 for a missing optional one).
int gn_sym_count(void);
const char *gn_sym_name(int i);
int gn_sym_required(int i);
void gn_bind(const uintptr_t *addrs);
int gn_set_cuda(uintptr_t getCurrent, uintptr_t setCurrent, uintptr_t eventRecord, uintptr_t streamWaitEvent, uintptr_t isCapturing);
int gn_version(int *v);
const char *gn_error_string(int r);
const char *gn_last_error(void);
size_t gn_config_size(void);
size_t gn_config_offset(int field);

int gn_get_unique_id(uintptr_t ctx, void *id);
int gn_comm_init(uintptr_t ctx, uintptr_t *comm, int nranks, void *ids, int nids, int rank, int scalable,
                 int blocking, int cga, int minCTAs, int maxCTAs, const char *netName, const char *commName);
int gn_comm_split(uintptr_t ctx, uintptr_t parent, int color, int key, uintptr_t *comm, int blocking,
                  const char *commName);
int gn_comm_async_error(uintptr_t comm, int *err);
int gn_comm_abort(uintptr_t ctx, uintptr_t comm);
int gn_comm_destroy(uintptr_t ctx, uintptr_t comm);
int gn_comm_finalize(uintptr_t ctx, uintptr_t comm);
int gn_comm_info(uintptr_t comm, int *count, int *dev, int *rank);

int gn_group_start(void);
int gn_group_end(void);

// gn_pre: record sync on cur and make nstream wait on it; record start.
int gn_pre(uintptr_t ctx, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv, uintptr_t startEv);
// gn_post: record the end event on nstream.
int gn_post(uintptr_t ctx, uintptr_t nstream, uintptr_t endEv);

// gn_issue is the hot path: in one call it makes ctx current, (async) makes
// nstream wait on cur through syncEv, records startEv, calls NCCL and
// records endEv. Zero events are skipped. scalar is the PREMUL_SUM factor as
// raw bits of the tensor's dtype, used when op == -1.
int gn_issue(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv,
             uintptr_t startEv, uintptr_t endEv, int kind, uintptr_t send, uintptr_t recv, size_t count,
             int dt, int op, uint64_t scalar, int root);

int gn_issue_nosync(uintptr_t comm, uintptr_t nstream, int kind, uintptr_t send, uintptr_t recv, size_t count, int dt, int op, uint64_t scalar, int root);
long long gn_bench_raw(uintptr_t ctx, uintptr_t comm, uintptr_t s, uintptr_t buf, size_t count, int dt, int iters);
// gn_bench_floor is the CUDA floor of one async allreduce + Wait as the
// backend issues it, from C: per call the context check, the sync event's
// record on cur and the internal stream's wait on it, the capture query,
// ncclAllReduce on the internal stream, the end event's record there, and
// Wait's wait of cur on it. It returns the host nanoseconds of iters calls.
long long gn_bench_floor(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, uintptr_t syncEv, uintptr_t endEv,
                         uintptr_t buf, size_t count, int dt, int iters);
// gn_bench_floor_cur is gn_bench_floor for Options.AsyncOnCurrentStream: per
// call the context check, the capture query, ncclAllReduce on cur and the
// end event's record there; Wait on cur makes no driver call.
long long gn_bench_floor_cur(uintptr_t ctx, uintptr_t comm, uintptr_t cur, uintptr_t endEv, uintptr_t buf, size_t count,
                             int dt, int iters);
// gn_bench_floor_cur_evs is gn_bench_floor_cur recording, op after op, a
// different end event of evs (nev of them, in turn from *next, which it
// advances), as the backend's pool hands out events: what rotating events
// cost the driver over re-recording one.
long long gn_bench_floor_cur_evs(uintptr_t ctx, uintptr_t comm, uintptr_t cur, const uintptr_t *evs, int nev, int *next,
                                 uintptr_t buf, size_t count, int dt, int iters);
// gn_bench_calls: each call of gn_bench_floor timed on its own (nccl_dl.c).
enum { GN_S_CLOCK, GN_S_CTX1, GN_S_REC_SYNC, GN_S_WAIT_SYNC, GN_S_CAPQ, GN_S_NCCL, GN_S_REC_END, GN_S_CTX2,
       GN_S_WAIT_END, GN_S_QUERY, GN_SLOTS };
void gn_bench_calls_syms(uintptr_t q, uintptr_t wr, uintptr_t wt);
int gn_bench_calls(uintptr_t ctx, uintptr_t comm, uintptr_t nstream, uintptr_t cur, const uintptr_t *syncEvs, int nsync,
                   uintptr_t endEv, uintptr_t semA, uintptr_t semB, volatile unsigned *hostB, uintptr_t buf,
                   size_t count, int dt, int iters, int mode, unsigned base, long long *ns);
#endif
