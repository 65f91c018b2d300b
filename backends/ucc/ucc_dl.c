// Run-time binding of libucc.so.1. See ucc_dl.h.
#include "ucc_dl.h"

#include "_cgo_export.h"

#include <sched.h>
#include <time.h>

typedef void *lib_h, *ctx_h, *team_h, *req_h, *cfg_h;

// X(symbol, required, return type, params)
#define GU_SYMS(X)                                                                                   \
	X(ucc_lib_config_read, 1, gu_status, (const char *, const char *, cfg_h *))                        \
	X(ucc_lib_config_release, 1, void, (cfg_h))                                                        \
	X(ucc_init_version, 1, gu_status, (unsigned, unsigned, const gu_lib_params *, cfg_h, lib_h *))     \
	X(ucc_finalize, 1, gu_status, (lib_h))                                                             \
	X(ucc_context_config_read, 1, gu_status, (lib_h, const char *, cfg_h *))                           \
	X(ucc_context_config_release, 1, void, (cfg_h))                                                    \
	X(ucc_context_create, 1, gu_status, (lib_h, const gu_context_params *, cfg_h, ctx_h *))            \
	X(ucc_context_progress, 1, gu_status, (ctx_h))                                                     \
	X(ucc_context_destroy, 1, gu_status, (ctx_h))                                                      \
	X(ucc_team_create_post, 1, gu_status, (ctx_h *, uint32_t, const gu_team_params *, team_h *))       \
	X(ucc_team_create_test, 1, gu_status, (team_h))                                                    \
	X(ucc_team_destroy, 1, gu_status, (team_h))                                                        \
	X(ucc_collective_init, 1, gu_status, (gu_coll_args *, req_h *, team_h))                            \
	X(ucc_collective_post, 1, gu_status, (req_h))                                                      \
	X(ucc_collective_finalize, 1, gu_status, (req_h))                                                  \
	X(ucc_status_string, 1, const char *, (gu_status))                                                 \
	X(ucc_get_version_string, 0, const char *, (void))

#define GU_DECL(f, req, ret, params) static ret(*p_##f) params;
GU_SYMS(GU_DECL)

enum {
#define GU_INDEX(f, req, ret, params) GU_I_##f,
	GU_SYMS(GU_INDEX) GU_NSYMS
};
#define GU_NAME(f, req, ret, params) #f,
static const char *const gu_names[] = {GU_SYMS(GU_NAME)};
#define GU_REQ(f, req, ret, params) req,
static const int gu_required[] = {GU_SYMS(GU_REQ)};

int gu_sym_count(void) { return GU_NSYMS; }
const char *gu_sym_name(int i) { return gu_names[i]; }
int gu_sym_required(int i) { return gu_required[i]; }

void gu_bind(const uintptr_t *addrs) {
#define GU_BIND(f, req, ret, params) p_##f = (ret(*) params)(void *)addrs[GU_I_##f];
	GU_SYMS(GU_BIND)
}

const char *gu_status_string(int st) { return p_ucc_status_string ? p_ucc_status_string(st) : "unknown UCC status"; }
const char *gu_version_string(void) { return p_ucc_get_version_string ? p_ucc_get_version_string() : "?"; }

// The out-of-band allgather UCC runs its wire-up on: Go's, over the
// group's store (oob.go). coll_info is the cgo.Handle of the Go side; the
// request is a handle too.
static gu_status gu_oob_allgather(void *src, void *recv, size_t size, void *info, void **req) {
	uintptr_t r = 0;
	int st = goUccOobAllgather((uintptr_t)info, src, recv, size, &r);
	*req = (void *)r;
	return st;
}
static gu_status gu_oob_test(void *req) { return goUccOobTest((uintptr_t)req); }
static gu_status gu_oob_free(void *req) { return goUccOobFree((uintptr_t)req); }

static void gu_oob_fill(gu_oob *o, uintptr_t info, uint32_t n, uint32_t rank) {
	o->allgather = gu_oob_allgather;
	o->req_test = gu_oob_test;
	o->req_free = gu_oob_free;
	o->coll_info = (void *)info;
	o->n_oob_eps = n;
	o->oob_ep = rank;
}

// API 1.7: the oldest whose headers gu_* mirror; newer libraries accept it.
#define GU_API_MAJOR 1
#define GU_API_MINOR 7

int gu_lib_init(uintptr_t *lib) {
	cfg_h cfg = NULL;
	gu_status st = p_ucc_lib_config_read(NULL, NULL, &cfg);
	if (st != GU_OK) return st;
	gu_lib_params p = {0};
	p.mask = 1u << 0; // UCC_LIB_PARAM_FIELD_THREAD_MODE
	p.thread_mode = 2; // UCC_THREAD_MULTIPLE: ops are posted by callers, progressed by the backend's goroutine
	lib_h l = NULL;
	st = p_ucc_init_version(GU_API_MAJOR, GU_API_MINOR, &p, cfg, &l);
	p_ucc_lib_config_release(cfg);
	*lib = (uintptr_t)l;
	return st;
}

int gu_context_create(uintptr_t lib, uintptr_t oob, uint32_t n, uint32_t rank, uintptr_t *ctx) {
	cfg_h cfg = NULL;
	gu_status st = p_ucc_context_config_read((lib_h)lib, NULL, &cfg);
	if (st != GU_OK) return st;
	gu_context_params p = {0};
	p.mask = (1u << 0) | (1u << 2); // TYPE | OOB
	p.type = 0;                     // UCC_CONTEXT_EXCLUSIVE
	gu_oob_fill(&p.oob, oob, n, rank);
	ctx_h c = NULL;
	st = p_ucc_context_create((lib_h)lib, &p, cfg, &c);
	p_ucc_context_config_release(cfg);
	*ctx = (uintptr_t)c;
	return st;
}

int gu_team_create_post(uintptr_t ctx, uintptr_t oob, uint32_t n, uint32_t rank, uintptr_t *team) {
	gu_team_params p = {0};
	p.mask = (1u << 2) | (1u << 4) | (1u << 7); // EP | EP_RANGE | OOB
	p.ep = rank;
	p.ep_range = 0; // UCC_COLLECTIVE_EP_RANGE_CONTIG
	gu_oob_fill(&p.oob, oob, n, rank);
	ctx_h c = (ctx_h)ctx;
	team_h t = NULL;
	gu_status st = p_ucc_team_create_post(&c, 1, &p, &t);
	*team = (uintptr_t)t;
	return st;
}

int gu_team_create_test(uintptr_t team) { return p_ucc_team_create_test((team_h)team); }
int gu_context_progress(uintptr_t ctx) { return p_ucc_context_progress((ctx_h)ctx); }

int gu_coll_init(uintptr_t team, const gu_desc *d, uintptr_t *req) {
	gu_coll_args a = {0};
	a.mask = 1u << 0; // UCC_COLL_ARGS_FIELD_FLAGS
	a.coll_type = d->coll_type;
	a.op = d->op;
	a.root = d->root;
	a.flags = d->flags;
	if (d->v_src) {
		a.src.info_v.buffer = (void *)d->src;
		a.src.info_v.counts = (uint64_t *)d->src_counts;
		a.src.info_v.displacements = (uint64_t *)d->src_displs;
		a.src.info_v.datatype = d->dt;
	} else {
		a.src.info.buffer = (void *)d->src;
		a.src.info.count = d->src_count;
		a.src.info.datatype = d->dt;
	}
	if (d->v_dst) {
		a.dst.info_v.buffer = (void *)d->dst;
		a.dst.info_v.counts = (uint64_t *)d->dst_counts;
		a.dst.info_v.displacements = (uint64_t *)d->dst_displs;
		a.dst.info_v.datatype = d->dt;
	} else {
		a.dst.info.buffer = (void *)d->dst;
		a.dst.info.count = d->dst_count;
		a.dst.info.datatype = d->dt;
	}
	if (d->as_size > 0) {
		a.mask |= (1u << 1) | (1u << 4); // TAG | ACTIVE_SET
		a.tag = d->tag;
		a.active_set.start = d->as_start;
		a.active_set.stride = d->as_stride;
		a.active_set.size = d->as_size;
	}
	req_h r = NULL;
	gu_status st = p_ucc_collective_init(&a, &r, (team_h)team);
	*req = (uintptr_t)r;
	return st;
}

int gu_coll_post(uintptr_t req) { return p_ucc_collective_post((req_h)req); }
// ucc_collective_test is inline in ucc.h: the status is the request's first field.
int gu_coll_test(uintptr_t req) { return *(volatile gu_status *)req; }
int gu_coll_finalize(uintptr_t req) { return p_ucc_collective_finalize((req_h)req); }
// gu_coll_start inits the n collectives of d into reqs, then posts them,
// in order: one cgo crossing per op instead of two per collective. An init
// that fails finalises the ones before it (nothing is posted): *at is its
// index, *posting 0. A post that fails finalises it and the ones after it
// (zeroed; the ones before stay posted): *at is its index, *posting 1.
// Once all are posted it returns how many are in progress: n, or with
// ctx nonzero (progress inline) what gu_reap leaves (failures into *err),
// with one ucc_context_progress between two reaps when the first leaves
// any. Failures are negative.
int gu_coll_start(uintptr_t team, const gu_desc *d, int n, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err) {
	*at = -1;
	*posting = 0; // failures are negative statuses, as result() in lib.go reads them
	for (int i = 0; i < n; i++) {
		gu_status st = gu_coll_init(team, &d[i], &reqs[i]);
		if (st < 0) {
			for (int j = 0; j < i; j++) {
				p_ucc_collective_finalize((req_h)reqs[j]);
				reqs[j] = 0;
			}
			reqs[i] = 0;
			*at = i;
			return st;
		}
	}
	*posting = 1;
	for (int i = 0; i < n; i++) {
		gu_status st = p_ucc_collective_post((req_h)reqs[i]);
		if (st < 0) {
			for (int j = i; j < n; j++) {
				p_ucc_collective_finalize((req_h)reqs[j]);
				reqs[j] = 0;
			}
			*at = i;
			return st;
		}
	}
	if (ctx) {
		// First a test alone: an op UCC finished in its post (one rank,
		// or the peers' data already in) needs no progress round.
		int busy = gu_reap(reqs, n, err);
		if (busy == 0) return 0;
		p_ucc_context_progress((ctx_h)ctx);
		return gu_reap(reqs, n, err);
	}
	return n;
}

// gu_reap tests the n requests (0: finalised before), finalises the ones
// UCC has finished and zeroes them, and keeps the first failed status in
// *err. It returns how many are still in progress.
int gu_reap(uintptr_t *reqs, int n, int *err) {
	int busy = 0;
	for (int i = 0; i < n; i++) {
		if (!reqs[i]) continue;
		gu_status st = *(volatile gu_status *)reqs[i];
		if (st == GU_INPROGRESS || st == GU_OPERATION_INITIALIZED) {
			busy++;
			continue;
		}
		if (st < 0 && *err == 0) *err = st;
		p_ucc_collective_finalize((req_h)reqs[i]);
		reqs[i] = 0;
	}
	return busy;
}

static int64_t gu_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// gu_drive is the raw loop of a blocking C caller: progress ctx and reap
// reqs until none is in progress (it returns 0), *stop turns nonzero (a
// submit waits for the lock the caller holds) or spin_ns pass; then it
// returns how many are still in progress; with drivers (the count of
// goroutines in Wait) it also returns once short_ns have passed while
// *drivers is above 1: another waiter's op, which only Go reaps, is not
// kept waiting for a long slice. The clock is read every 16
// rounds, from the 16th on (the spin counts from there): a small op is
// done before, and a clock read costs a good part of it. With yield, each
// round that leaves the op in progress ends in sched_yield, so that a
// peer rank waiting for this core (more ranks than cores) runs: what Open
// MPI does when oversubscribed (mpi_yield_when_idle). With nslots > 0 it
// also returns once each of the nslots fingerprint board slots (see
// gu_fp_drive) holds tag: the peers' fingerprints of the op held behind
// this one are all in, and Go starts it now rather than after spin_ns.
//
// With nvslots > 0 it also checks, while it spins, the op posted ahead of
// its check that is next to be checked (fpahead.go): vslots are its
// peers' slots, vtag its number + 1 and (vw1, vw2) this rank's words; once
// every peer's slot holds vtag, *verdict is set (1: all equal, 2: some
// differ; it stays 0 while one is missing). Why: a rank waiting here for
// its peer's data has the time to read the peers' slots, which the lazy
// check (fpahead.go) would otherwise read in its next batch.
// gu_words_differ reports whether the published slot s holds words other
// than (w1, w2), the ahead flag masked: the comparison every look at a
// peer's slot makes once its number is there.
static inline int gu_words_differ(const uint64_t *s, uint64_t w1, uint64_t w2) {
	return (__atomic_load_n(&s[1], __ATOMIC_RELAXED) & ~(uint64_t)GU_FP_AHEAD) != w1 || __atomic_load_n(&s[2], __ATOMIC_RELAXED) != w2;
}

static void gu_verify(const uintptr_t *vslots, int nvslots, uint64_t vtag, uint64_t vw1, uint64_t vw2, int *verdict) {
	int differ = 0;
	for (int i = 0; i < nvslots; i++) {
		const uint64_t *s = (const uint64_t *)vslots[i];
		if (__atomic_load_n(&s[0], __ATOMIC_ACQUIRE) != vtag) return;
		if (gu_words_differ(s, vw1, vw2)) differ = 1;
	}
	*verdict = differ ? 2 : 1;
}

int gu_drive(uintptr_t ctx, uintptr_t *reqs, int n, int *err, const int32_t *stop, const int32_t *drivers, int64_t spin_ns,
             int64_t short_ns, int yield, const uintptr_t *slots, int nslots, uint64_t tag, const uintptr_t *vslots, int nvslots,
             uint64_t vtag, uint64_t vw1, uint64_t vw2, int *verdict) {
	int64_t begin = 0, end = 0;
	int seen = 0;
	for (unsigned k = 1;; k++) {
		int busy = gu_reap(reqs, n, err);
		if (nvslots > 0 && *verdict == 0) gu_verify(vslots, nvslots, vtag, vw1, vw2, verdict);
		if (busy == 0) return 0;
		if (__atomic_load_n(stop, __ATOMIC_RELAXED) != 0) return busy;
		if (nslots > 0) {
			while (seen < nslots && __atomic_load_n((const uint64_t *)slots[seen], __ATOMIC_ACQUIRE) == tag) seen++;
			if (seen == nslots) return busy;
		}
		if ((k & 15) == 0) {
			int64_t now = gu_now_ns();
			if (end == 0) {
				begin = now;
				end = now + spin_ns;
			} else if (now > end) {
				return busy;
			} else if (drivers != NULL && now - begin > short_ns && __atomic_load_n(drivers, __ATOMIC_RELAXED) > 1) {
				return busy; // another Wait spins on the lock: its op is reaped only outside
			}
		}
		p_ucc_context_progress((ctx_h)ctx);
		if (yield) sched_yield();
	}
}

// gu_fp_drive is the Wait of an op held for its peers' fingerprints
// (fingerprint.go, fpfast.go) in one crossing: it spins on the nslots
// peer slots of the shared-memory board (each the address of the slot's
// number word, followed by its two data words) until each holds tag (the
// op's number + 1), as the drive loop in Go would poll them; then, when
// every peer's words equal this rank's (w1, w2), it starts the op
// (gu_coll_start, progressing a small one inline) and drives it
// (gu_drive) for what is left of spin_ns, and sets *started. Before the
// start it returns GU_FP_WAITING (*stop turned nonzero, or spin_ns
// passed; with progress, it progresses ctx between looks, for this
// group's ops already in UCC) or GU_FP_DIFFER: words that differ are
// Go's to judge (a count that matches any count, or a mismatch to name).
// UCC sees nothing of the op before the words agree.
int gu_fp_drive(uintptr_t team, const gu_desc *d, int n, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err,
                const int32_t *stop, int64_t spin_ns, int yield, const uintptr_t *slots, int nslots, uint64_t tag, uint64_t w1,
                uint64_t w2, int progress, int *started) {
	*started = 0;
	int64_t end = 0;
	int seen = 0; // peers whose slot holds tag, in order
	for (unsigned k = 1;; k++) {
		while (seen < nslots && __atomic_load_n((const uint64_t *)slots[seen], __ATOMIC_ACQUIRE) == tag) seen++;
		if (seen == nslots) break;
		if (__atomic_load_n(stop, __ATOMIC_RELAXED) != 0) return GU_FP_WAITING;
		if ((k & 15) == 0) {
			int64_t now = gu_now_ns();
			if (end == 0) {
				end = now + spin_ns;
			} else if (now > end) {
				return GU_FP_WAITING;
			}
		}
		if (progress) p_ucc_context_progress((ctx_h)ctx);
		if (yield) sched_yield();
	}
	for (int i = 0; i < nslots; i++) {
		const uint64_t *s = (const uint64_t *)slots[i];
		// A peer that posted the op ahead (fpahead.go) sets GU_FP_AHEAD in
		// its first word: not part of the op.
		if (gu_words_differ(s, w1, w2)) return GU_FP_DIFFER;
	}
	*started = 1;
	int st = gu_coll_start(team, d, n, reqs, at, posting, ctx, err);
	if (st <= 0) return st;
	int64_t left = spin_ns;
	if (end != 0) {
		left = end - gu_now_ns();
		if (left < 0) return st;
	}
	return gu_drive(ctx, reqs, n, err, stop, NULL, left, left, yield, NULL, 0, 0, NULL, 0, 0, 0, 0, NULL);
}

// gu_fp_ahead starts an op posted ahead of its check (fpahead.go) in one
// crossing, with the publication Go did in another (fpRings.put): it
// writes this rank's slot (mine: the address of its number word on the
// shared-memory board; the words w1 with GU_FP_AHEAD set and w2 first,
// then the number tag with a release store, as fpRings.put orders them)
// and starts the op (gu_coll_start, progressing it once inline when ctx is
// nonzero), whose result it returns. The check itself comes later, in
// batches (gu_fp_agree). Last it asks for the cache line of this rank's
// next slot (next) for writing, so that the line a peer read in its last
// batch is back before the next op's publication, which would otherwise
// wait for it ahead of UCC's first atomic.
int gu_fp_ahead(uintptr_t team, const gu_desc *d, uintptr_t *reqs, int *at, int *posting, uintptr_t ctx, int *err, uintptr_t mine,
                uint64_t tag, uint64_t w1, uint64_t w2, uintptr_t next) {
	uint64_t *m = (uint64_t *)mine;
	__atomic_store_n(&m[1], w1 | (uint64_t)GU_FP_AHEAD, __ATOMIC_RELAXED);
	__atomic_store_n(&m[2], w2, __ATOMIC_RELAXED);
	__atomic_store_n(&m[0], tag, __ATOMIC_RELEASE);
	int st = gu_coll_start(team, d, 1, reqs, at, posting, ctx, err);
	// PREFETCHW (a no-op where the CPU lacks it): a hint, never a fault.
	__asm__ volatile("prefetchw %0" : : "m"(*(const char *)next));
	return st;
}

// gu_fp_agree is the check of a batch of ops posted ahead (fpahead.go)
// in one crossing: it counts the leading numbers seq, seq+1, ... (n at
// most) whose slot on every one of the nrings peer rings (rings[i]: the
// address of the ring's first slot; k slots each) holds the number + 1
// and words equal to (w1, w2), the ahead flag masked. Go's judge takes
// the first that is missing or differs. Why C: a batch reads the peers'
// slots in order, and the loads of consecutive cache lines overlap here,
// where Go's judge took them one at a time with its bookkeeping between.
int gu_fp_agree(const uintptr_t *rings, int nrings, uint64_t k, uint64_t seq, int n, uint64_t w1, uint64_t w2) {
	int i;
	uint64_t at = seq % k; // (seq + i) % k, kept without a division per slot
	for (i = 0; i < n; i++, at = at + 1 == k ? 0 : at + 1) {
		uint64_t s = seq + (uint64_t)i;
		for (int r = 0; r < nrings; r++) {
			const uint64_t *sl = (const uint64_t *)(rings[r] + at * GU_FP_SLOT);
			if (__atomic_load_n(&sl[0], __ATOMIC_ACQUIRE) != s + 1) return i;
			if (gu_words_differ(sl, w1, w2)) return i;
		}
	}
	return i;
}

// gu_yield gives the core away (Options.Yield) where Go spins without
// gu_drive: a driver whose op waits for its peers' fingerprints.
void gu_yield(void) { sched_yield(); }

int gu_team_destroy(uintptr_t team) { return p_ucc_team_destroy((team_h)team); }
int gu_context_destroy(uintptr_t ctx) { return p_ucc_context_destroy((ctx_h)ctx); }
int gu_finalize(uintptr_t lib) { return p_ucc_finalize((lib_h)lib); }

#define GU_F(T, f) offsetof(T, f)
size_t gu_layout(int s, int f) {
#define GU_ROW(T, ...)                                                                \
	{                                                                                 \
		size_t offs[] = {__VA_ARGS__};                                                \
		if (f < 0) return sizeof(T);                                                  \
		return (size_t)f < sizeof(offs) / sizeof(offs[0]) ? offs[f] : (size_t)-1;     \
	}
	switch (s) {
	case 0: GU_ROW(gu_lib_params, GU_F(gu_lib_params, mask), GU_F(gu_lib_params, thread_mode), GU_F(gu_lib_params, coll_types),
	               GU_F(gu_lib_params, reduction_types), GU_F(gu_lib_params, sync_type))
	case 1: GU_ROW(gu_oob, GU_F(gu_oob, allgather), GU_F(gu_oob, req_test), GU_F(gu_oob, req_free), GU_F(gu_oob, coll_info),
	               GU_F(gu_oob, n_oob_eps), GU_F(gu_oob, oob_ep))
	case 2: GU_ROW(gu_context_params, GU_F(gu_context_params, mask), GU_F(gu_context_params, type), GU_F(gu_context_params, sync_type),
	               GU_F(gu_context_params, oob), GU_F(gu_context_params, ctx_id), GU_F(gu_context_params, mem_params))
	case 3: GU_ROW(gu_team_params, GU_F(gu_team_params, mask), GU_F(gu_team_params, flags), GU_F(gu_team_params, ordering),
	               GU_F(gu_team_params, outstanding_colls), GU_F(gu_team_params, ep), GU_F(gu_team_params, ep_list),
	               GU_F(gu_team_params, ep_range), GU_F(gu_team_params, team_size), GU_F(gu_team_params, sync_type),
	               GU_F(gu_team_params, oob), GU_F(gu_team_params, p2p_conn), GU_F(gu_team_params, mem_params),
	               GU_F(gu_team_params, ep_map), GU_F(gu_team_params, id))
	case 4: GU_ROW(gu_info, GU_F(gu_info, buffer), GU_F(gu_info, count), GU_F(gu_info, datatype), GU_F(gu_info, mem_type))
	case 5: GU_ROW(gu_info_v, GU_F(gu_info_v, buffer), GU_F(gu_info_v, counts), GU_F(gu_info_v, displacements),
	               GU_F(gu_info_v, datatype), GU_F(gu_info_v, mem_type))
	case 6: GU_ROW(gu_coll_args, GU_F(gu_coll_args, mask), GU_F(gu_coll_args, coll_type), GU_F(gu_coll_args, src),
	               GU_F(gu_coll_args, dst), GU_F(gu_coll_args, op), GU_F(gu_coll_args, flags), GU_F(gu_coll_args, root),
	               GU_F(gu_coll_args, error_type), GU_F(gu_coll_args, tag), GU_F(gu_coll_args, global_work_buffer),
	               GU_F(gu_coll_args, cb), GU_F(gu_coll_args, timeout), GU_F(gu_coll_args, active_set),
	               GU_F(gu_coll_args, src_memh), GU_F(gu_coll_args, dst_memh))
	case 7: GU_ROW(gu_ep_map, GU_F(gu_ep_map, type), GU_F(gu_ep_map, ep_num), GU_F(gu_ep_map, u))
	case 8: GU_ROW(gu_p2p_conn, GU_F(gu_p2p_conn, conn_info_lookup), GU_F(gu_p2p_conn, conn_info_release),
	               GU_F(gu_p2p_conn, conn_ctx), GU_F(gu_p2p_conn, req_test), GU_F(gu_p2p_conn, req_free))
	}
	return (size_t)-1;
}

// gu_raw_allreduce is the loop of a C program calling UCC directly
// (cmd/conftest/benchc/ucc-bench-raw.c's): iters float32 SUM allreduces
// of buf in place, each init, post, test plus progress, finalize. It is the
// peer of the package's benchmarks, on the backend's own team.
int gu_raw_allreduce(uintptr_t team, uintptr_t ctx, uintptr_t buf, uint64_t count, int64_t iters) {
	for (int64_t i = 0; i < iters; i++) {
		gu_coll_args a = {0};
		a.mask = 1u << 0; // UCC_COLL_ARGS_FIELD_FLAGS
		a.flags = 1u << 0; // UCC_COLL_ARGS_FLAG_IN_PLACE
		a.coll_type = 1 << 2; // UCC_COLL_TYPE_ALLREDUCE
		a.op = 0; // UCC_OP_SUM
		a.src.info.buffer = (void *)buf;
		a.src.info.count = count;
		a.src.info.datatype = 11u << 3; // UCC_DT_FLOAT32
		a.dst.info = a.src.info;
		req_h r = NULL;
		gu_status st = p_ucc_collective_init(&a, &r, (team_h)team);
		if (st != GU_OK) return st;
		if ((st = p_ucc_collective_post(r)) != GU_OK) return st;
		while ((st = *(volatile gu_status *)r) == GU_INPROGRESS || st == GU_OPERATION_INITIALIZED) {
			p_ucc_context_progress((ctx_h)ctx);
		}
		gu_status fst = p_ucc_collective_finalize(r);
		if (st != GU_OK) return st;
		if (fst != GU_OK) return fst;
	}
	return GU_OK;
}
