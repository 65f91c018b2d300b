#!/usr/bin/env bash
# Builds .gpu/ucc/ for the ucc bench on the GPU machine (16 free cores, where
# the developers' 2 shared cores make every spinning rank wait for a core):
# conftest, the raw libucc loop (built here with gcc against the sid root's
# ucc headers), the Open MPI peer (built here with mpicc) and run.sh; the sid
# .debs go to .ucc/debs (scripts/ucc-debs.sh). Then `run` with carry
# [".gpu", ".ucc"] and the command `bash .gpu/ucc/run.sh` (a helper whose
# worktree does not travel copies both under one ignored folder of the
# checkout that does, and sets GOCOLL_UCC_DEBS to the .debs' new place).
#
#   scripts/ucc-gpu-bench.sh
#
# run.sh there: sources scripts/ucc-gpu-env.sh, then `conftest bench
# --backend ucc` with the raw loop, cpupool and Open MPI beside it at 2 and 4
# ranks, 8 B to 64 MiB (GOCOLL_UCC_GPU_BENCH overrides its flags), after the
# one-rank BenchmarkAllreduce of backends/ucc (the backend against the raw C
# loop on its own team) and the dispatcher's BenchmarkDispatchAllreduce; any
# other conftest-NAME binary put in .gpu/ucc/ (an older build, to compare)
# runs the ucc series alone between the rounds, and an extra.sh there runs
# before them. GOCOLL_UCC_GPU_ROUNDS (1), GOCOLL_UCC_GPU_DEADLINE (200 s)
# and GOCOLL_UCC_GPU_TIMEOUT (120 s per invocation) bound it. Logs land in
# $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ucc-common.sh
out=.gpu/ucc
mkdir -p "$out"
export CGO_ENABLED=1
go build -ldflags='-s -w' -o "$out/conftest" ./cmd/conftest
go test -c -ldflags='-s -w' -o "$out/ucc.test" ./backends/ucc
go test -c -ldflags='-s -w' -o "$out/dispatcher.test" ./dispatcher
root=$(ucc_root_dir)
if [ ! -f "$root/usr/include/ucc/api/ucc.h" ]; then
	echo "ucc-gpu-bench: no ucc headers in $root (scripts/ucc-root.sh)" >&2
	exit 1
fi
inc=$(mktemp -d)
trap 'rm -rf "$inc"' EXIT
ln -s "$root/usr/include/ucc" "$inc/ucc"
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$inc" -o "$out/ucc-bench-raw" cmd/conftest/benchc/ucc-bench-raw.c -ldl
if command -v mpicc >/dev/null; then
	mpicc -O2 -Wall -Wextra -Werror -o "$out/bench-mpi" cmd/conftest/benchc/bench-mpi.c
else
	echo "ucc-gpu-bench: no mpicc here; the run goes without Open MPI" >&2
	rm -f "$out/bench-mpi"
fi
ls .ucc/debs/libucc1_*.deb >/dev/null 2>&1 || scripts/ucc-debs.sh .ucc/debs
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine (scripts/ucc-gpu-bench.sh made it).
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
{
	date -u
	nproc
	uptime
	lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)|Thread'
} > "$OUT/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "${GOCOLL_UCC_DEBS:-.ucc/debs}" >> "$OUT/machine.txt" 2>&1 || exit 1
peers=(--raw-bin "$b/ucc-bench-raw" --peers raw-ucc,cpupool)
if [ -x "$b/bench-mpi" ] && timeout 30 mpirun --allow-run-as-root --oversubscribe -np 2 "$b/bench-mpi" --sizes 8 --iters 0.01 >> "$OUT/machine.txt" 2>&1; then
	peers=(--raw-bin "$b/ucc-bench-raw" --peers raw-ucc,cpupool,openmpi --mpi-bin "$b/bench-mpi")
else
	echo "Open MPI peer unavailable" >> "$OUT/machine.txt"
fi
flags=${GOCOLL_UCC_GPU_BENCH:---nproc 2,4 --repeat 2 --sizes 8,64,512,4K,32K,64K,256K,1M,4M,16M,64M}
rounds=${GOCOLL_UCC_GPU_ROUNDS:-1}
# No invocation starts after GOCOLL_UCC_GPU_DEADLINE seconds, and none runs
# past it by more than GOCOLL_UCC_GPU_TIMEOUT: the device time is counted.
deadline=${GOCOLL_UCC_GPU_DEADLINE:-200}
step() { # step LABEL CMD...: one invocation, logged, within the deadline
	local left=$((deadline - SECONDS)) label=$1
	shift
	if [ "$left" -le 10 ]; then
		echo "== skipped (deadline): $label" >> "$OUT/bench.log"
		return
	fi
	echo "== $label $(date -u +%T) (t=${SECONDS}s)" >> "$OUT/bench.log"
	timeout "$((left < ${GOCOLL_UCC_GPU_TIMEOUT:-120} ? left : ${GOCOLL_UCC_GPU_TIMEOUT:-120}))" "$@" >> "$OUT/bench.log" 2>&1
	echo "rc=$? (t=${SECONDS}s)" >> "$OUT/bench.log"
}
# The backend's own cost per op, one rank, beside the raw C loop on the
# same team (backends/ucc BenchmarkAllreduce), and the dispatcher's, when
# their test binaries were put here.
if [ -x "$b/ucc.test" ]; then
	step "ucc.test BenchmarkAllreduce" "$b/ucc.test" -test.run '^$' -test.bench Allreduce -test.benchmem -test.count 2
fi
if [ -x "$b/dispatcher.test" ]; then
	step "dispatcher.test BenchmarkDispatchAllreduce" "$b/dispatcher.test" -test.run '^$' -test.bench DispatchAllreduce -test.benchmem -test.count 2
fi
if [ -x "$b/extra.sh" ]; then
	step "extra.sh" "$b/extra.sh"
fi
for r in $(seq "$rounds"); do
	step "round $r: conftest bench --backend ucc $flags ${peers[*]}" "$b/conftest" bench --backend ucc $flags "${peers[@]}"
	for other in "$b"/conftest-*; do
		[ -x "$other" ] || continue
		step "round $r: $(basename "$other") bench --backend ucc --peers none $flags" "$other" bench --backend ucc --peers none $flags
	done
done
uptime >> "$OUT/machine.txt"
RUN
chmod +x "$out/run.sh"
du -sh "$out" .ucc/debs
