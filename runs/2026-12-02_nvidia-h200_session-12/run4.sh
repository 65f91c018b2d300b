#!/usr/bin/env bash
# Session 12, fourth call: main (2d1b01c, the lazy check) against base
# b951645 at 8 B, 2 ranks, more turns; then 1 and 4 MiB at 4 ranks.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ct-base ct-head; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct-head "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d1-on 8 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t d0-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
t big4 2 --nproc 4 --sizes 1M,4M --iters 20 --repeat 2
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s12d.tgz" .
