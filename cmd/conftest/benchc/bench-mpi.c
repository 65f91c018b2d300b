// bench-mpi: Open MPI's side of `conftest bench` (the openmpi series).
// It runs conftest bench-rank's loop with MPI calls: per op and size
// (float32, SUM, root 0), -w warm-up calls, MPI_Barrier, -n calls timed
// with MPI_Wtime, and with -c a fresh input, one more call and a check of
// every output element; out-of-place, then in-place (MPI_IN_PLACE) where
// MPI has it. The calls are MPI's blocking ones, back to back (queuing
// nonblocking collectives on one buffer is not allowed by MPI), so the
// loop is osu_*'s. Every rank prints one line per op and size:
//
//   BENCH2 openmpi op rank bytes count oop_us oop_wrong ip_us ip_wrong
//
// The input pattern, the buffer layouts and the expected outputs are
// conftest's (bench_rank.go): element i of rank r is (7r + i) % 23 + 1.
// MPI's in-place reduce_scatter leaves the rank's piece at the start of
// the buffer (not at its offset as NCCL does); the check follows MPI.
// conftest bench embeds this file and compiles it with mpicc; by hand:
//
//   mpicc -O2 -o bench-mpi cmd/conftest/benchc/bench-mpi.c
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./bench-mpi --op allreduce,allgather
//       --sizes 8,1048576 [-n 20 -w 5 -c]
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static float val(int r, long i) { return (float)((r * 7 + i) % 23 + 1); }

enum { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALLTOALL, SENDRECV, NOPS };
static const char *names[NOPS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"};

// One mode of one op: input and output pointers into send/recv, lengths.
struct kase {
	int op, in_place;
	long count, part;
	float *in, *out;
	long in_n, out_n;
};

static void layout(struct kase *k, float *send, float *recv) {
	long c = k->count, p = k->part;
	k->in = send, k->out = recv, k->in_n = c, k->out_n = c;
	switch (k->op) {
	case ALLGATHER:
		k->in_n = p;
		if (k->in_place) k->in = recv + rank * p;
		break;
	case REDUCE_SCATTER:
		k->out_n = p;
		if (k->in_place) k->in = recv; // MPI_IN_PLACE: input and result in recv
		break;
	default:
		if (k->in_place) k->in = recv;
	}
}

static float expect(const struct kase *k, long i) {
	long p = k->part;
	float s = 0;
	switch (k->op) {
	case ALLREDUCE:
	case REDUCE:
		for (int q = 0; q < size; q++) s += val(q, i);
		return s;
	case ALLGATHER: return val((int)(i / p), i % p);
	case REDUCE_SCATTER:
		for (int q = 0; q < size; q++) s += val(q, rank * p + i);
		return s;
	case BROADCAST: return val(0, i);
	case ALLTOALL: return val((int)(i / p), rank * p + i % p);
	case SENDRECV: return val((rank - 1 + size) % size, i);
	}
	return NAN;
}

static int supports(int op, int in_place) {
	if (op == BROADCAST) return in_place; // MPI_Bcast is in place
	if (op == SENDRECV) return !in_place && size > 1;
	return 1;
}

static void prepare(struct kase *k) {
	// The output first (a sentinel), then the input, which may lie in it.
	long n = k->op == REDUCE_SCATTER && k->in_place ? k->count : k->out_n;
	for (long i = 0; i < n; i++) k->out[i] = -1;
	for (long i = 0; i < k->in_n; i++) k->in[i] = val(rank, i);
}

static void call(const struct kase *k) {
	const void *in = k->in_place ? MPI_IN_PLACE : k->in;
	int p = (int)k->part, c = (int)k->count;
	switch (k->op) {
	case ALLREDUCE: MPI_Allreduce(in, k->out, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
	case ALLGATHER: MPI_Allgather(in, p, MPI_FLOAT, k->out, p, MPI_FLOAT, MPI_COMM_WORLD); break;
	case REDUCE_SCATTER: MPI_Reduce_scatter_block(in, k->out, p, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
	case BROADCAST: MPI_Bcast(k->out, c, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
	case REDUCE:
		// MPI_IN_PLACE only at the root; the others pass their buffer.
		MPI_Reduce(k->in_place && rank != 0 ? k->out : in, k->out, c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
		break;
	case ALLTOALL: MPI_Alltoall(in, p, MPI_FLOAT, k->out, p, MPI_FLOAT, MPI_COMM_WORLD); break;
	case SENDRECV:
		MPI_Sendrecv(k->in, c, MPI_FLOAT, (rank + 1) % size, 0, k->out, c, MPI_FLOAT, (rank - 1 + size) % size, 0,
			MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		break;
	}
}

// measure returns the mean µs per call and sets *wrong (-1: unchecked).
static double measure(struct kase *k, long iters, long warm, int check, long *wrong) {
	prepare(k);
	for (long i = 0; i < warm; i++) call(k);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (long i = 0; i < iters; i++) call(k);
	double us = (MPI_Wtime() - t0) * 1e6 / (double)iters;
	*wrong = -1;
	if (check) {
		MPI_Barrier(MPI_COMM_WORLD);
		prepare(k);
		MPI_Barrier(MPI_COMM_WORLD);
		call(k);
		*wrong = 0;
		if (!(k->op == REDUCE && rank != 0)) {
			for (long i = 0; i < k->out_n; i++) {
				if (k->out[i] != expect(k, i)) (*wrong)++;
			}
		}
	}
	return us;
}

static void die(const char *what, const char *arg) {
	fprintf(stderr, "bench-mpi: %s %s\n", what, arg);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *sizes = "8", *ops = "allreduce";
	long n = 20, w = 5;
	int check = 0;
	double scale = 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "-c") == 0) {
			check = 1;
			continue;
		}
		if (v == NULL) die("flag without a value:", a);
		i++;
		if (strcmp(a, "--sizes") == 0) sizes = v;
		else if (strcmp(a, "--op") == 0) ops = v;
		else if (strcmp(a, "-n") == 0) n = atol(v);
		else if (strcmp(a, "-w") == 0) w = atol(v);
		else if (strcmp(a, "--iters") == 0) scale = atof(v);
		else die("unknown flag", a);
	}
	long top = 0;
	for (const char *s = sizes; *s;) {
		char *end;
		long b = strtol(s, &end, 10);
		if (end == s || b < 4) die("bad size list", sizes);
		top = b > top ? b : top;
		s = *end == ',' ? end + 1 : end;
	}
	float *send = malloc((size_t)top), *recv = malloc((size_t)top);
	if (send == NULL || recv == NULL) die("out of memory for", sizes);
	for (const char *o = ops; *o;) {
		size_t len = strcspn(o, ",");
		int op = -1;
		for (int j = 0; j < NOPS; j++) {
			if (strlen(names[j]) == len && strncmp(o, names[j], len) == 0) op = j;
		}
		if (op < 0) die("unknown op in", ops);
		o += len + (o[len] == ',');
		for (const char *s = sizes; *s;) {
			char *end;
			long b = strtol(s, &end, 10);
			s = *end == ',' ? end + 1 : end;
			long count = b / 4;
			if (op == ALLGATHER || op == REDUCE_SCATTER || op == ALLTOALL) count -= count % size;
			if (count == 0) continue;
			long iters = n, warm = w;
			if (iters == 0) {
				long base = (256L << 20) / b;
				base = base < 5 ? 5 : base > 2000 ? 2000 : base;
				iters = (long)(scale * (double)base);
				iters = iters < 3 ? 3 : iters;
				warm = iters / 10 < 2 ? 2 : iters / 10;
			}
			char f[2][2][32];
			for (int m = 0; m < 2; m++) {
				strcpy(f[m][0], "-");
				strcpy(f[m][1], "-");
				if (!supports(op, m)) continue;
				struct kase k = {.op = op, .in_place = m, .count = count, .part = count / size};
				layout(&k, send, recv);
				long wrong;
				double us = measure(&k, iters, warm, check, &wrong);
				snprintf(f[m][0], sizeof f[m][0], "%.3f", us);
				if (wrong >= 0) snprintf(f[m][1], sizeof f[m][1], "%ld", wrong);
			}
			printf("BENCH2 openmpi %s %d %ld %ld %s %s %s %s\n", names[op], rank, count * 4, count, f[0][0], f[0][1], f[1][0],
				f[1][1]);
			fflush(stdout);
		}
	}
	free(send);
	free(recv);
	MPI_Finalize();
	return 0;
}
