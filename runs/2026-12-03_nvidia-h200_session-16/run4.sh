#!/usr/bin/env bash
# Session 16, call 4 on nvidia-h200: main (22842fd) alone against raw
# libucc, more turns of the 4-rank 1 and 4 MiB rows, and 64 MiB at 2 and
# 4 ranks (run3.sh's way).
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ct.xz" > $BIN/ct; chmod +x $BIN/ct
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1 limit=$2; shift 2; local s=$SECONDS
	timeout $limit scripts/ucc-turns.sh "$R/$name" $BIN/ct $BIN/ct "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t big4b 150 2 --nproc 4 --sizes 1M,4M --iters 20 --repeat 3
t big64 150 1 --nproc 4 --sizes 64M --iters 20 --repeat 3
t big64n2 100 1 --nproc 2 --sizes 64M --iters 20 --repeat 3
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s16d.tgz" .
