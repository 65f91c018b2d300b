#!/usr/bin/env bash
# Session 11, second call on nvidia-h200's CPU cores: what the ucc
# backend's 8 B time at two ranks is made of (BenchmarkTwoRanks8B with
# the check off, without the completion clock, with long progress naps),
# and the flight recorder's share through conftest bench.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
for f in ucc-head.test ucc-noclock.test conftest-new; do xz -dc "$b/$f.xz" > $BIN/$f; chmod +x $BIN/$f; done
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
S=$R/summary.txt
two() { local v=$1 label=$2; shift 2
	echo "$label $( (cd backends/ucc && env "$@" $BIN/ucc-$v.test -test.run '^$' -test.bench TwoRanks8B 2>&1) | grep Benchmark)" >> "$S"; }
ct() { local label=$1; shift
	env "$@" $BIN/conftest-new bench --backend ucc --nproc 2 --sizes 8 --iters 50 --depth 1 --peers raw-ucc --by-size --repeat 3 \
		--raw-bin "$b/ucc-bench-raw" --json "$R/ct-$label-$i.json" > "$R/ct-$label-$i.log" 2>&1
	echo "ct $label $i $(grep -E '^ +8 ' "$R/ct-$label-$i.log" | tail -1)" >> "$S"; }
for i in 1 2 3; do
	two head head X=1
	two head fp-off GOCOLL_UCC_FINGERPRINTS=off
	two noclock noclock X=1
	two head park50ms GOCOLL_UCC_MAX_PARK_US=50000
	ct rec-on X=1
	ct rec-off GOCOLL_TRACE_BUFFER_SIZE=0
done
cat /proc/loadavg >> "$R/machine.txt"
cat "$S"
tar -C "$R" -czf "$OUT/s11b.tgz" .
