// bench-mpi: an osu_allreduce-style loop over Open MPI, the MPI peer of
// `conftest bench --mpi`. Per size (bytes, float32 SUM, MPI_IN_PLACE as
// the gocoll backends reduce in place): warm-up, MPI_Barrier, `iters`
// blocking MPI_Allreduce calls timed with MPI_Wtime, the mean per call
// reduced with MAX to rank 0, which prints "BENCH bytes microseconds".
// Iteration counts follow conftest bench-rank's rule. conftest bench
// embeds this file and compiles it with mpicc; by hand:
//
//   mpicc -O2 -o bench-mpi scripts/bench-mpi.c
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./bench-mpi --sizes 8,1048576 [--iters SCALE]
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	const char *sizes = "8";
	double scale = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--sizes") == 0) {
			sizes = argv[i + 1];
		} else if (strcmp(argv[i], "--iters") == 0) {
			scale = atof(argv[i + 1]);
		} else {
			fprintf(stderr, "bench-mpi: unknown flag %s\n", argv[i]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	for (const char *s = sizes; *s;) {
		char *end;
		long b = strtol(s, &end, 10);
		if (end == s || b < 4) {
			fprintf(stderr, "bench-mpi: bad size list %s\n", sizes);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
		s = *end == ',' ? end + 1 : end;
		int count = (int)(b / 4);
		float *buf = malloc((size_t)count * sizeof *buf);
		for (int i = 0; i < count; i++) {
			buf[i] = 1;
		}
		long base = (256L << 20) / b;
		base = base < 5 ? 5 : base > 2000 ? 2000 : base;
		long iters = (long)(scale * (double)base);
		iters = iters < 3 ? 3 : iters;
		long warm = iters / 10 < 2 ? 2 : iters / 10;
		for (long i = 0; i < warm; i++) {
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long i = 0; i < iters; i++) {
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		}
		double us = (MPI_Wtime() - t0) * 1e6 / (double)iters, max;
		MPI_Reduce(&us, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("BENCH %ld %.2f\n", b, max);
			fflush(stdout);
		}
		free(buf);
	}
	MPI_Finalize();
	return 0;
}
