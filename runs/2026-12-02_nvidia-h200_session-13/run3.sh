#!/usr/bin/env bash
# Session 13, third call: main (b7e572c) alone against raw libucc, more
# turns: 8 B at the default depth and --depth 1, 1-64 MiB at 2 ranks, 1-64
# MiB at 4 ranks. ucc-turns.sh with the same binary as base and new: every
# invocation is a turn of main (pool base-*.json and new-*.json together).
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ct-head.xz" > $BIN/ct-head; chmod +x $BIN/ct-head
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-head $BIN/ct-head "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; python3 scripts/ucc-pool.py main "$R/$name"/*.json; } >> "$R/summary.txt"; }
t d0 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
t d1 2 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t big2 1 --nproc 2 --sizes 1M,4M,16M,64M --iters 20 --repeat 2
t big4 1 --nproc 4 --sizes 1M,4M,16M,64M --iters 20 --repeat 2
t d0b 2 --nproc 2 --sizes 8 --iters 50 --repeat 3
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s13c.tgz" .
