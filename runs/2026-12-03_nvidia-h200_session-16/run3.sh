#!/usr/bin/env bash
# Session 16, call 3 on nvidia-h200: main (22842fd) alone against raw
# libucc, the issue's rows: 8 B at 2 and 4 ranks (--depth 1 and the
# default depth), then 1, 4 and 16 MiB at 2 and 4 ranks. Each step is
# scripts/ucc-turns.sh with the same binary on both sides (every turn is
# main's), so "base" and "new" are two halves of one sample.
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
t n2d1 60 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t n2d0 60 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
t n4d1 70 2 --nproc 4 --sizes 8 --iters 50 --repeat 3 --depth 1
t n4d0 70 2 --nproc 4 --sizes 8 --iters 50 --repeat 3
t big2 110 1 --nproc 2 --sizes 1M,4M,16M --iters 20 --repeat 3
t big4 110 1 --nproc 4 --sizes 1M,4M,16M --iters 20 --repeat 3
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s16c.tgz" .
