// Hand-written declarations of the part of the UCC API (ucc/api/ucc.h,
// unchanged on x86-64 from 1.7 to 1.9) that gocoll uses. libucc.so.1 is
// opened at run time (internal/dl), so the package builds with gcc alone;
// abi_test.go checks every size and offset below against ucc.h where the
// header exists.
#ifndef GOCOLL_UCC_DL_H
#define GOCOLL_UCC_DL_H

#include <stddef.h>
#include <stdint.h>

typedef int gu_status;  // ucc_status_t
enum {
	GU_OK = 0,
	GU_INPROGRESS = 1,
	GU_OPERATION_INITIALIZED = 2,
	GU_ERR_NOT_SUPPORTED = -1,
	GU_ERR_NOT_IMPLEMENTED = -2,
	GU_ERR_NO_MESSAGE = -6,
};

// ucc_oob_coll_t.
typedef struct {
	gu_status (*allgather)(void *src, void *recv, size_t size, void *info, void **req);
	gu_status (*req_test)(void *req);
	gu_status (*req_free)(void *req);
	void *coll_info;
	uint32_t n_oob_eps;
	uint32_t oob_ep;
} gu_oob;

// ucc_lib_params_t.
typedef struct {
	uint64_t mask;
	int thread_mode;
	uint64_t coll_types;
	uint64_t reduction_types;
	int sync_type;
} gu_lib_params;

// ucc_mem_map_params_t.
typedef struct {
	void *segments;
	uint64_t n_segments;
} gu_mem_params;

// ucc_context_params_t.
typedef struct {
	uint64_t mask;
	int type;
	int sync_type;
	gu_oob oob;
	uint64_t ctx_id;
	gu_mem_params mem_params;
} gu_context_params;

// ucc_team_p2p_conn_t.
typedef struct {
	void *conn_info_lookup, *conn_info_release, *conn_ctx, *req_test, *req_free;
} gu_p2p_conn;

// ucc_ep_map_t.
typedef struct {
	int type;
	uint64_t ep_num;
	union {
		struct { uint64_t start; int64_t stride; } strided;
		struct { void *map; size_t elem_size; } array;
		struct { void *cb; void *cb_ctx; } cb;
	} u;
} gu_ep_map;

// ucc_team_params_t.
typedef struct {
	uint64_t mask;
	uint64_t flags;
	int ordering;
	uint64_t outstanding_colls;
	uint64_t ep;
	uint64_t *ep_list;
	int ep_range;
	uint64_t team_size;
	int sync_type;
	gu_oob oob;
	gu_p2p_conn p2p_conn;
	gu_mem_params mem_params;
	gu_ep_map ep_map;
	uint64_t id;
} gu_team_params;

// ucc_coll_buffer_info_t and ucc_coll_buffer_info_v_t.
typedef struct {
	void *buffer;
	uint64_t count;
	uint64_t datatype;
	int mem_type;
} gu_info;
typedef struct {
	void *buffer;
	uint64_t *counts;
	uint64_t *displacements;
	uint64_t datatype;
	int mem_type;
} gu_info_v;

// ucc_coll_args_t.
typedef struct {
	uint64_t mask;
	int coll_type;
	union { gu_info info; gu_info_v info_v; } src;
	union { gu_info info; gu_info_v info_v; } dst;
	int op;
	uint64_t flags;
	uint64_t root;
	int error_type;
	uint16_t tag;
	void *global_work_buffer;
	struct { void *cb; void *data; } cb;
	double timeout;
	struct { uint64_t start; int64_t stride; uint64_t size; } active_set;
	void *src_memh;
	void *dst_memh;
} gu_coll_args;

// One collective as Go describes it: gu_coll_init fills a gu_coll_args from
// it. Buffers are addresses; v selects the _v buffer infos (counts and
// displacements arrays of team size, 64-bit).
typedef struct {
	int coll_type;
	int op;
	uint64_t root;
	uint64_t flags;
	uint64_t dt;
	int v_src, v_dst;
	uintptr_t src, dst;
	uint64_t src_count, dst_count;
	uintptr_t src_counts, src_displs, dst_counts, dst_displs;
	// Active set (a two-rank broadcast carries send and recv); size 0: none.
	uint64_t as_start, as_size;
	int64_t as_stride;
	uint16_t tag;
} gu_desc;

int gu_sym_count(void);
const char *gu_sym_name(int i);
int gu_sym_required(int i);
void gu_bind(const uintptr_t *addrs);

const char *gu_status_string(int st);
const char *gu_version_string(void);

int gu_lib_init(uintptr_t *lib);
int gu_context_create(uintptr_t lib, uintptr_t oob, uint32_t n, uint32_t rank, uintptr_t *ctx);
int gu_team_create_post(uintptr_t ctx, uintptr_t oob, uint32_t n, uint32_t rank, uintptr_t *team);
int gu_team_create_test(uintptr_t team);
int gu_context_progress(uintptr_t ctx);
int gu_coll_init(uintptr_t team, const gu_desc *d, uintptr_t *req);
int gu_coll_post(uintptr_t req);
int gu_coll_test(uintptr_t req);
int gu_coll_finalize(uintptr_t req);
int gu_coll_start(uintptr_t team, const gu_desc *d, int n, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err);
int gu_reap(uintptr_t *reqs, int n, int *err);
int gu_drive(uintptr_t ctx, uintptr_t *reqs, int n, int *err, const int32_t *stop, const int32_t *drivers, int64_t spin_ns,
             int64_t short_ns, int yield, const uintptr_t *slots, int nslots, uint64_t tag, const uintptr_t *vslots, int nvslots,
             uint64_t vtag, uint64_t vw1, uint64_t vw2, int *verdict);
// gu_fp_drive's outcomes before the start (it returns gu_coll_start's or
// gu_drive's result once it started the op).
enum { GU_FP_WAITING = 1, GU_FP_DIFFER = 2 };
// A peer posted the op ahead of the check: fpSlot.ahead (fpAheadBit, fpahead.go).
#define GU_FP_AHEAD (1u << 24)
// GU_FP_SLOT is the board's slot size in bytes (fpboard.go's fpSlotSize).
#define GU_FP_SLOT 32
int gu_fp_drive(uintptr_t team, const gu_desc *d, int n, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err,
                const int32_t *stop, int64_t spin_ns, int yield, const uintptr_t *slots, int nslots, uint64_t tag, uint64_t w1,
                uint64_t w2, int progress, int *started);
int gu_fp_ahead(uintptr_t team, const gu_desc *d, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err, uintptr_t mine,
                uint64_t tag, uint64_t w1, uint64_t w2, uintptr_t next);
int gu_fp_agree(const uintptr_t *rings, int nrings, uint64_t k, uint64_t seq, int n, uint64_t w1, uint64_t w2);
int gu_raw_allreduce(uintptr_t team, uintptr_t ctx, uintptr_t buf, uint64_t count, int64_t iters);
void gu_yield(void);
int gu_team_destroy(uintptr_t team);
int gu_context_destroy(uintptr_t ctx);
int gu_finalize(uintptr_t lib);

// gu_layout returns sizeof (field -1) or the offset of field f of struct s
// (see abi_test.go for the numbering), or (size_t)-1 past the last field.
size_t gu_layout(int s, int f);
#endif
