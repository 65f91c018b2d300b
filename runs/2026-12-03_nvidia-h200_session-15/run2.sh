#!/usr/bin/env bash
# Session 15, ucc on nvidia-h200: one conftest (60b3eae+docs) with the
# runtime's default GOMAXPROCS (16) against GOMAXPROCS=4 in the ranks'
# environment, taking turns (scripts/ucc-turns.sh), 8 B at the default depth
# and --depth 1, then 1 and 4 MiB at 2 ranks.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ct.xz" > $BIN/ct; chmod +x $BIN/ct
printf '#!/bin/sh\nGOMAXPROCS=4 exec %s "$@"\n' $BIN/ct > $BIN/ct-gmp4; chmod +x $BIN/ct-gmp4
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	timeout 200 scripts/ucc-turns.sh "$R/$name" $BIN/ct $BIN/ct-gmp4 "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d0 4 --nproc 2 --sizes 8 --iters 50 --repeat 3
t d1 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t big2 2 --nproc 2 --sizes 1M,4M --iters 20 --repeat 2
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s15b.tgz" .
