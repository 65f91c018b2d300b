#!/usr/bin/env bash
# Session 12, third call: the lazy check's second form (new2) against base
# b951645 at 8 B, 2 ranks, more turns; then 1-64 MiB at 2 ranks.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ct-base ct-new2; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct-new2 "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d1-on 6 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
GOCOLL_UCC_FINGERPRINTS=off t d1-off 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t d0-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
t big2 2 --nproc 2 --sizes 1M,4M,16M,64M --iters 20 --repeat 2
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s12c.tgz" .
