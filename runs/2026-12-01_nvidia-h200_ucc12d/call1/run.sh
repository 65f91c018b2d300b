#!/usr/bin/env bash
# ucc12d call 1 (session 5) on nvidia-h200's 16 CPU cores (no GPU use):
# where does the 4-rank 1 MiB gap over the raw libucc loop go?
#   1. a Go CPU profile of each of ours' 4 ranks (main), 4 ranks 1 MiB;
#   2. perf stat and a system-wide perf record of ours (main) and of the
#      raw loop alone, the same size, ranks and window;
#   3. main and v1 (long C slices in the drive loop) taking turns:
#      conftest bench --by-size --repeat 5 at 4 ranks 1 MiB, check on, x2,
#      then the check off, then v1's other 4-rank sizes while time is left.
# Results: $OUT/ucc12d.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in main v1; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; uname -r; command -v perf; perf --version; cat /proc/sys/kernel/perf_event_paranoid
  cat /sys/kernel/mm/transparent_hugepage/enabled; lscpu | grep -E 'Model name|^CPU\(s\)|NUMA'; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
export UCC_MC_CPU_MPOOL_ELEM_SIZE=32mb # what conftest bench sets for both sides
deadline=${DEADLINE:-140}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
rawdirect() { # the raw loop alone: 4 ranks, 1 MiB, window 4, --iters SCALE
	local shm=/dev/shm/ucc12d-raw-$RANDOM pids=()
	for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 MASTER_PORT=1 "$b/ucc-bench-raw" --sizes 1048576 --iters "$1" --thread multiple --shm "$shm" --window 4 & pids+=($!); done
	wait "${pids[@]}"; }
ours() { /tmp/b/conftest-main bench --backend ucc --nproc 4 --sizes 1M -n 0 --iters "$1" --peers none "${@:2}"; }
HAVE_PERF=0; command -v perf >/dev/null && perf stat -e task-clock true >/dev/null 2>&1 && HAVE_PERF=1
echo "HAVE_PERF=$HAVE_PERF" >> "$R/machine.txt"
step "pprof ours main 4r 1M" 25 ours 20 --tune "--cpuprofile $R/p-{rank}.prof"
if [ $HAVE_PERF = 1 ]; then
	ev=task-clock,context-switches,cpu-migrations,page-faults,cycles:u,cycles:k,instructions:u
	step "perf stat ours" 20 perf stat -e $ev -o "$R/stat-ours.txt" -- bash -c "$(declare -f ours); ours 20"
	step "perf stat raw" 20 perf stat -e $ev -o "$R/stat-raw.txt" -- bash -c "b=$b; $(declare -f rawdirect); rawdirect 20"
	step "perf record ours" 20 perf record -a -F 499 -o /tmp/perf-ours.data -- bash -c "$(declare -f ours); ours 12"
	step "perf record raw" 20 perf record -a -F 499 -o /tmp/perf-raw.data -- bash -c "b=$b; $(declare -f rawdirect); rawdirect 12"
	for s in ours raw; do
		[ -f /tmp/perf-$s.data ] && timeout 20 perf report -i /tmp/perf-$s.data --stdio --no-children --sort comm,dso,sym --percent-limit 0.3 > "$R/report-$s.txt" 2>&1
		[ -f /tmp/perf-$s.data ] && timeout 10 perf report -i /tmp/perf-$s.data --stdio --no-children --sort comm,dso --percent-limit 0.2 > "$R/report-$s-dso.txt" 2>&1
	done
fi
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 5 --iters 4)
for r in 1 2; do
	for v in main v1; do
		step "4r 1M $v on r$r" 25 /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 1M "${raw[@]}" --json "$R/l4-1m-$v-r$r.json"
	done
done
for v in v1 main; do
	GOCOLL_UCC_FINGERPRINTS=off step "4r 1M $v off" 25 /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 1M "${raw[@]}" --json "$R/l4-1m-$v-off.json"
done
step "4r 4M,16M v1 on" 40 /tmp/b/conftest-v1 bench --backend ucc --nproc 4 --sizes 4M,16M "${raw[@]}" --json "$R/l4-v1.json"
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ |^skip" "$L" | head -80
for s in ours raw; do echo "-- $s"; cat "$R/stat-$s.txt" 2>/dev/null | grep -v '^$'; head -45 "$R/report-$s.txt" 2>/dev/null | grep -v '^#' | grep -v '^$'; done
tar -C "$R" -czf "$OUT/ucc12d.tgz" .
