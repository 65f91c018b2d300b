#!/usr/bin/env bash
# Session 13, second call: the 64-byte handle (b7e572c) against its base
# dd1001a: conftest bench 8 B at the default depth and --depth 1 (taking
# turns), BenchmarkTwoRanks8B old and new, 1 and 4 MiB at 2 ranks.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ct-base ct-head; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
for f in ucc-new ucc-old; do xz -dc "$b/$f.test.xz" > $BIN/$f.test; chmod +x $BIN/$f.test; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct-head "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d0 4 --nproc 2 --sizes 8 --iters 50 --repeat 3
t d1 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
(cd backends/ucc && for i in 1 2; do for v in old new; do
	echo "== $v $(date -u +%T)" >> "$R/tworanks.txt"
	$BIN/ucc-$v.test -test.run '^$' -test.bench TwoRanks8B -test.timeout 5m >> "$R/tworanks.txt" 2>&1
done; done)
t big2 2 --nproc 2 --sizes 1M,4M --iters 20 --repeat 2
t big2pin 2 --nproc 2 --sizes 1M,4M --iters 20 --repeat 2 --pin 2-3,4-5
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"; grep "^==\|^Bench" "$R/tworanks.txt"
tar -C "$R" -czf "$OUT/s13b.tgz" .
