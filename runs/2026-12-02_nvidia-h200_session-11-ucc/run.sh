#!/usr/bin/env bash
# Session 11 on nvidia-h200's CPU cores (no GPU use): the ucc backend's
# 8 B allreduce over raw libucc, base (ca0db99, the session's start) and
# new (main) taking turns (scripts/ucc-turns.sh), and new's
# BenchmarkTwoRanks8B.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in conftest-base conftest-new ucc.test; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/conftest-base $BIN/conftest-new "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
two() { (cd backends/ucc && $BIN/ucc.test -test.run '^$' -test.bench TwoRanks8B 2>&1 | grep Benchmark >> "$R/summary.txt"); }
t d1-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 5 --depth 1
two
GOCOLL_UCC_FINGERPRINTS=off t d1-off 2 --nproc 2 --sizes 8 --iters 50 --repeat 5 --depth 1
t d0-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 5
two
t big4 1 --nproc 4 --sizes 1M,16M --iters 20 --repeat 2
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s11.tgz" .
