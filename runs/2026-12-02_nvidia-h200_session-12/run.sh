#!/usr/bin/env bash
# Session 12 on nvidia-h200's CPU cores: the lazy check (959aa87) against
# main before it (b951645), ucc 8 B at 2 ranks through conftest
# (scripts/ucc-turns.sh) and BenchmarkTwoRanks8B.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ct-base ct-new ucc-base.test ucc-new.test; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; lscpu | grep -E "Model name|Thread|Socket"; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct-new "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
two() { for v in base new base new; do (cd backends/ucc && $BIN/ucc-$v.test -test.run '^$' -test.bench TwoRanks8B 2>&1 | grep Benchmark | sed "s/^/$v /" >> "$R/summary.txt"); done; }
t d1-on 5 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
two
GOCOLL_UCC_FINGERPRINTS=off t d1-off 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
t d0-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
GOCOLL_TRACE_BUFFER_SIZE=0 t d1-norec 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s12.tgz" .
