#!/usr/bin/env bash
# Session 12, second call: where a 2-rank 8 B op's time goes on
# nvidia-h200 (rdtsc timelines of each op's start, post and completion:
# the backend loop of BenchmarkTwoRanks8B for base b951645 and the lazy
# check), then the lazy check (second form)
# against base through conftest at both depths.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ct-base ct-new2 ucc-base-tl.test ucc-new2-tl.test ucc-new2.test; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; lscpu | grep -E "Model name|Thread|Socket|NUMA node0"; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
ghz=$("$b/tsc"); echo "tsc GHz $ghz" >> "$R/summary.txt"
for v in base new2 base new2; do
	rm -f /tmp/tl-*.txt
	(cd backends/ucc && TWO_TL=1 GOCOLL_UCC_BENCH_OPS=100000 $BIN/ucc-$v-tl.test -test.run '^$' -test.bench TwoRanks8B 2>&1 | grep Benchmark | sed "s/^/$v /" >> "$R/summary.txt")
	python3 "$b/tl2.py" $ghz /tmp/tl-backend-0.txt /tmp/tl-backend-1.txt /tmp/tl-raw-0.txt /tmp/tl-raw-each-0.txt >> "$R/summary.txt"
	python3 "$b/tl3.py" $ghz /tmp/tl-backend-0.txt /tmp/tl-raw-0.txt >> "$R/summary.txt"
done
raw=(--raw-bin "$b/ucc-bench-raw")
t() { local name=$1; shift; local s=$SECONDS
	scripts/ucc-turns.sh "$R/$name" $BIN/ct-base $BIN/ct-new2 "$@" "${raw[@]}" > /dev/null 2>&1
	{ echo "== $name ($((SECONDS - s)) s): $*"; cat "$R/$name/pooled.txt"; } >> "$R/summary.txt"; }
t d0-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 3
t d1-on 3 --nproc 2 --sizes 8 --iters 50 --repeat 3 --depth 1
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s12b.tgz" .
