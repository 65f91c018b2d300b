// ucc-bench-raw: the raw libucc allreduce loop that `conftest bench
// --backend ucc` measures the ucc backend against. One process per rank
// (RANK, WORLD_SIZE from the environment, as conftest's launcher sets them);
// it calls UCC directly, with nothing of gocoll in between:
//
//   dlopen libucc.so.1 -> lib config -> ucc_init_version -> context (OOB
//   allgather over a shared-memory file) -> team post/test -> per size:
//   warm-up, barrier, then `iters` times: collective_init, post, test plus
//   ucc_context_progress until done, finalize (with --window W, up to W of
//   them posted at once over W buffers, as bench-rank queues its ops).
//
// That per-op sequence is the one the backend runs for every Allreduce
// (float32 SUM, in place, host memory), so the difference between the two
// is the backend's own cost: the dispatcher, the Work, the hand-off to and
// from the progress goroutine, and cgo. Rank 0 prints one line per size,
// "BENCH bytes microseconds" (the max over ranks of the mean per
// iteration), the format conftest's launcher collects. Iteration counts
// follow conftest bench-rank's rule, so both loops run the same numbers.
//
//   ucc-bench-raw --sizes 8,1048576 [--iters SCALE] [--shm FILE]
//                 [--thread single|multiple] [--lib PATH] [--window W]
//
// --window W queues the ops as conftest bench-rank does on the host: W
// buffers in turn, up to W collectives posted at once, an op waited for
// only before its buffer is reused, and all at the end (bench-rank's
// hostWindow; conftest passes the same W). 1: one blocking op at a time.
//
// --thread multiple is the backend's thread mode (its ops are posted by the
// callers' goroutines and progressed by its own); single is what a
// one-threaded C program would pick. conftest bench embeds this file,
// compiles it with gcc against the sid root's headers (only ucc/ from
// there) and runs it through --wrap, e.g. scripts/ucc-run.sh, in the root.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ucc/api/ucc.h>

static void *lib;

static void *sym(const char *name) {
	void *p = dlsym(lib, name);
	if (p == NULL) {
		fprintf(stderr, "ucc-bench-raw: %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

static const char *(*status_string)(ucc_status_t);

static void check(const char *what, ucc_status_t st) {
	if (st != UCC_OK) {
		fprintf(stderr, "ucc-bench-raw: %s: %s (%d)\n", what, status_string(st), (int)st);
		exit(1);
	}
}

// The OOB allgather: a file in /dev/shm that every rank maps. Round r has a
// counter and one slot per rank; a rank's post copies its piece into its
// slot and then increments the counter (release), the test sees the round
// complete when the counter reaches the world size (acquire) and copies the
// slots out. The post never waits, as UCC requires.
#define MAX_RANKS 64
#define MAX_ROUNDS 8
#define SLOT (64 << 10)
struct round {
	uint32_t arrived;
	char pad[60];
	char slot[MAX_RANKS][SLOT];
};
static struct round *rounds;
static int rank, size, next_round;

struct oob_req {
	struct round *r;
	void *dst;
	size_t len;
};
static struct oob_req reqs[MAX_ROUNDS];

static ucc_status_t oob_allgather(void *src, void *dst, size_t len, void *info, void **req) {
	(void)info;
	if (next_round == MAX_ROUNDS || len > SLOT) {
		fprintf(stderr, "ucc-bench-raw: OOB allgather %d of %zu bytes: more than the file holds\n", next_round, len);
		return UCC_ERR_NO_MEMORY;
	}
	struct oob_req *q = &reqs[next_round];
	q->r = &rounds[next_round++];
	q->dst = dst;
	q->len = len;
	memcpy(q->r->slot[rank], src, len);
	__atomic_fetch_add(&q->r->arrived, 1, __ATOMIC_RELEASE);
	*req = q;
	return UCC_OK;
}

static ucc_status_t oob_test(void *req) {
	struct oob_req *q = req;
	if (__atomic_load_n(&q->r->arrived, __ATOMIC_ACQUIRE) < (uint32_t)size) {
		sched_yield(); // the ranks may outnumber the cores
		return UCC_INPROGRESS;
	}
	for (int p = 0; p < size; p++) {
		memcpy((char *)q->dst + (size_t)p * q->len, q->r->slot[p], q->len);
	}
	return UCC_OK;
}

static ucc_status_t oob_free(void *req) {
	(void)req;
	return UCC_OK;
}

static ucc_status_t (*coll_init)(ucc_coll_args_t *, ucc_coll_req_h *, ucc_team_h);
static ucc_status_t (*coll_post)(ucc_coll_req_h);
static ucc_status_t (*coll_finalize)(ucc_coll_req_h);
static ucc_status_t (*ctx_progress)(ucc_context_h);
static ucc_context_h ctx;
static ucc_team_h team;

// start inits and posts a collective.
static ucc_coll_req_h start(ucc_coll_args_t *a) {
	ucc_coll_req_h req;
	check("ucc_collective_init", coll_init(a, &req, team));
	check("ucc_collective_post", coll_post(req));
	return req;
}

// finish tests req with progress until it is done, then finalizes it.
static void finish(ucc_coll_req_h req) {
	ucc_status_t st;
	while ((st = ucc_collective_test(req)) == UCC_INPROGRESS || st == UCC_OPERATION_INITIALIZED) {
		ctx_progress(ctx);
	}
	check("ucc_collective_test", st);
	check("ucc_collective_finalize", coll_finalize(req));
}

// run is one blocking collective: init, post, test plus progress, finalize.
static void run(ucc_coll_args_t *a) { finish(start(a)); }

static void allreduce_args(ucc_coll_args_t *a, void *buf, size_t count, ucc_datatype_t dt, ucc_reduction_op_t op) {
	memset(a, 0, sizeof *a);
	a->mask = UCC_COLL_ARGS_FIELD_FLAGS;
	a->flags = UCC_COLL_ARGS_FLAG_IN_PLACE;
	a->coll_type = UCC_COLL_TYPE_ALLREDUCE;
	a->op = op;
	a->src.info.buffer = buf;
	a->src.info.count = count;
	a->src.info.datatype = dt;
	a->src.info.mem_type = UCC_MEMORY_TYPE_HOST;
	a->dst.info = a->src.info;
}

// queued is n float32 SUM allreduces over the w buffers bufs in turn,
// bench-rank's host loop: buffer i % w, its previous op finished before
// it is reused, every op finished at the end, in post order.
#define MAX_WINDOW 16
static void queued(float **bufs, int w, size_t count, long n) {
	ucc_coll_req_h reqs[MAX_WINDOW];
	ucc_coll_args_t a;
	for (long i = 0; i < n; i++) {
		int k = (int)(i % w);
		if (i >= w) {
			finish(reqs[k]);
		}
		allreduce_args(&a, bufs[k], count, UCC_DT_FLOAT32, UCC_OP_SUM);
		reqs[k] = start(&a);
	}
	for (long i = n > w ? n - w : 0; i < n; i++) {
		finish(reqs[i % w]);
	}
}

// allreduce is one blocking in-place allreduce.
static void allreduce(void *buf, size_t count, ucc_datatype_t dt, ucc_reduction_op_t op) {
	ucc_coll_args_t a;
	allreduce_args(&a, buf, count, dt, op);
	run(&a);
}

static void barrier(void) {
	ucc_coll_args_t a;
	memset(&a, 0, sizeof a);
	a.coll_type = UCC_COLL_TYPE_BARRIER;
	run(&a);
}

static double now_us(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int env_int(const char *name) {
	const char *v = getenv(name);
	if (v == NULL) {
		fprintf(stderr, "ucc-bench-raw: %s is not set (run it under conftest bench)\n", name);
		exit(2);
	}
	return atoi(v);
}

int main(int argc, char **argv) {
	const char *sizes = "8", *shm = NULL, *path = getenv("GOCOLL_UCC_LIBRARY"), *thread = "single";
	double scale = 1;
	int window = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--sizes") == 0) {
			sizes = argv[i + 1];
		} else if (strcmp(argv[i], "--iters") == 0) {
			scale = atof(argv[i + 1]);
		} else if (strcmp(argv[i], "--shm") == 0) {
			shm = argv[i + 1];
		} else if (strcmp(argv[i], "--thread") == 0) {
			thread = argv[i + 1];
		} else if (strcmp(argv[i], "--lib") == 0) {
			path = argv[i + 1];
		} else if (strcmp(argv[i], "--window") == 0) {
			window = atoi(argv[i + 1]);
			if (window < 1 || window > MAX_WINDOW) {
				fprintf(stderr, "ucc-bench-raw: --window %s: 1 to %d\n", argv[i + 1], MAX_WINDOW);
				return 2;
			}
		} else {
			fprintf(stderr, "ucc-bench-raw: unknown flag %s\n", argv[i]);
			return 2;
		}
	}
	rank = env_int("RANK");
	size = env_int("WORLD_SIZE");
	if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size) {
		fprintf(stderr, "ucc-bench-raw: rank %d of %d: at most %d ranks\n", rank, size, MAX_RANKS);
		return 2;
	}
	char shmbuf[256];
	if (shm == NULL) {
		snprintf(shmbuf, sizeof shmbuf, "/dev/shm/gocoll-ucc-bench-raw-%s", getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "0");
		shm = shmbuf;
	}
	// Every rank creates or opens the file and sizes it alike: a new file
	// reads as zeros, so no rank has to go first. Rank 0 unlinks it once
	// the team exists (every rank has mapped it by then).
	int fd = open(shm, O_RDWR | O_CREAT, 0600);
	size_t bytes = sizeof(struct round) * MAX_ROUNDS;
	if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
		fprintf(stderr, "ucc-bench-raw: %s: %s\n", shm, strerror(errno));
		return 1;
	}
	rounds = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (rounds == MAP_FAILED) {
		fprintf(stderr, "ucc-bench-raw: mmap %s: %s\n", shm, strerror(errno));
		return 1;
	}

	if (path == NULL || *path == 0) {
		path = "libucc.so.1";
	}
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "ucc-bench-raw: dlopen %s: %s\n", path, dlerror());
		return 1;
	}
	status_string = sym("ucc_status_string");
	ucc_status_t (*lib_config_read)(const char *, const char *, ucc_lib_config_h *) = sym("ucc_lib_config_read");
	void (*lib_config_release)(ucc_lib_config_h) = sym("ucc_lib_config_release");
	ucc_status_t (*init_version)(unsigned, unsigned, const ucc_lib_params_t *, const ucc_lib_config_h, ucc_lib_h *) =
		sym("ucc_init_version");
	ucc_status_t (*ctx_config_read)(ucc_lib_h, const char *, ucc_context_config_h *) = sym("ucc_context_config_read");
	void (*ctx_config_release)(ucc_context_config_h) = sym("ucc_context_config_release");
	ucc_status_t (*ctx_create)(ucc_lib_h, const ucc_context_params_t *, const ucc_context_config_h, ucc_context_h *) =
		sym("ucc_context_create");
	ucc_status_t (*team_post)(ucc_context_h *, uint32_t, const ucc_team_params_t *, ucc_team_h *) =
		sym("ucc_team_create_post");
	ucc_status_t (*team_test)(ucc_team_h) = sym("ucc_team_create_test");
	coll_init = sym("ucc_collective_init");
	coll_post = sym("ucc_collective_post");
	coll_finalize = sym("ucc_collective_finalize");
	ctx_progress = sym("ucc_context_progress");

	ucc_lib_config_h lcfg;
	check("ucc_lib_config_read", lib_config_read(NULL, NULL, &lcfg));
	ucc_lib_params_t lp;
	memset(&lp, 0, sizeof lp);
	lp.mask = UCC_LIB_PARAM_FIELD_THREAD_MODE;
	lp.thread_mode = strcmp(thread, "multiple") == 0 ? UCC_THREAD_MULTIPLE : UCC_THREAD_SINGLE;
	ucc_lib_h h;
	check("ucc_init", init_version(UCC_API_MAJOR, UCC_API_MINOR, &lp, lcfg, &h));
	lib_config_release(lcfg);

	ucc_context_config_h ccfg;
	check("ucc_context_config_read", ctx_config_read(h, NULL, &ccfg));
	ucc_context_params_t cp;
	memset(&cp, 0, sizeof cp);
	cp.mask = UCC_CONTEXT_PARAM_FIELD_OOB | UCC_CONTEXT_PARAM_FIELD_TYPE;
	cp.type = UCC_CONTEXT_EXCLUSIVE;
	cp.oob.allgather = oob_allgather;
	cp.oob.req_test = oob_test;
	cp.oob.req_free = oob_free;
	cp.oob.n_oob_eps = (uint32_t)size;
	cp.oob.oob_ep = (uint32_t)rank;
	check("ucc_context_create", ctx_create(h, &cp, ccfg, &ctx));
	ctx_config_release(ccfg);

	ucc_team_params_t tp;
	memset(&tp, 0, sizeof tp);
	tp.mask = UCC_TEAM_PARAM_FIELD_EP | UCC_TEAM_PARAM_FIELD_EP_RANGE | UCC_TEAM_PARAM_FIELD_OOB;
	tp.ep = (uint64_t)rank;
	tp.ep_range = UCC_COLLECTIVE_EP_RANGE_CONTIG;
	tp.oob = cp.oob;
	check("ucc_team_create_post", team_post(&ctx, 1, &tp, &team));
	ucc_status_t st;
	while ((st = team_test(team)) == UCC_INPROGRESS) {
		ctx_progress(ctx);
	}
	check("ucc_team_create_test", st);
	barrier();
	if (rank == 0) {
		unlink(shm);
	}

	for (const char *s = sizes; *s;) {
		char *end;
		long b = strtol(s, &end, 10);
		if (end == s || b < 4) {
			fprintf(stderr, "ucc-bench-raw: bad size list %s\n", sizes);
			return 2;
		}
		s = *end == ',' ? end + 1 : end;
		size_t count = (size_t)b / 4;
		float *bufs[MAX_WINDOW];
		for (int k = 0; k < window; k++) {
			bufs[k] = malloc(count * sizeof *bufs[k]);
			for (size_t i = 0; i < count; i++) {
				bufs[k][i] = 1;
			}
		}
		long base = (256L << 20) / b;
		base = base < 5 ? 5 : base > 2000 ? 2000 : base;
		long iters = (long)(scale * (double)base);
		iters = iters < 3 ? 3 : iters;
		long warm = iters / 10 < 2 ? 2 : iters / 10;
		queued(bufs, window, count, warm);
		barrier();
		double t0 = now_us();
		queued(bufs, window, count, iters);
		double us = (now_us() - t0) / (double)iters;
		allreduce(&us, 1, UCC_DT_FLOAT64, UCC_OP_MAX);
		if (rank == 0) {
			printf("BENCH %ld %.2f\n", b, us);
			fflush(stdout);
		}
		for (int k = 0; k < window; k++) {
			free(bufs[k]);
		}
	}
	// Teardown is left to process exit: the numbers are out, and UCC's
	// destroy calls are collective and would only add a wait.
	return 0;
}
