#!/usr/bin/env bash
# Session 16, ucc on nvidia-h200: where the 8 B op's distance from raw
# libucc goes end to end. One conftest (HEAD), taking turns
# (scripts/ucc-turns.sh) with itself under GOCOLL_TRACE_BUFFER_SIZE=0 (the
# flight recorder off) and with GOCOLL_UCC_FINGERPRINTS=off (the check off),
# 8 B at --depth 1; CPU profiles of both ranks; BenchmarkTwoRanks8B (the
# backend alone against the raw loop); perf, if the machine has it.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ct.xz" > $BIN/ct; chmod +x $BIN/ct
xz -dc "$b/ucc.test.xz" > $BIN/ucc.test; chmod +x $BIN/ucc.test
printf '#!/bin/sh\nGOCOLL_TRACE_BUFFER_SIZE=0 exec %s "$@"\n' $BIN/ct > $BIN/ct-fr0; chmod +x $BIN/ct-fr0
printf '#!/bin/sh\nGOCOLL_UCC_FINGERPRINTS=off exec %s "$@"\n' $BIN/ct > $BIN/ct-fpoff; chmod +x $BIN/ct-fpoff
{ date -u; nproc; lscpu | grep -E "Model name|Socket|NUMA node"; cat /proc/loadavg; command -v perf || echo "no perf"; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1 other=$2; shift 2; local s=$SECONDS
	timeout 150 scripts/ucc-turns.sh "$R/$name" $BIN/ct $BIN/$other "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): base = ct, new = $other: $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t fr0 ct-fr0 4 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t fpoff ct-fpoff 4 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
# Both ranks' CPU profiles, 8 B, --depth 1.
timeout 60 $BIN/ct bench --backend ucc --nproc 2 --peers raw-ucc "${raw[@]}" --sizes 8 -n 3000000 \
	--tune "--depth 1 --cpuprofile $R/prof-d1-{rank}" > "$R/prof-d1.txt" 2>&1
if command -v perf > /dev/null; then
	timeout 60 perf record -g -e cpu-clock -F 4000 -o "$R/perf-d1.data" -- $BIN/ct bench --backend ucc --nproc 2 --peers none \
		--sizes 8 -n 3000000 --tune "--depth 1" > "$R/perf-d1-bench.txt" 2>&1
	perf report -i "$R/perf-d1.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | head -150 > "$R/perf-d1.txt"
	rm -f "$R/perf-d1.data"
fi
(cd backends/ucc && timeout 120 $BIN/ucc.test -test.run '^$' -test.bench TwoRanks8B 2>&1 | grep Benchmark) >> "$R/summary.txt"
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s16a.tgz" .
