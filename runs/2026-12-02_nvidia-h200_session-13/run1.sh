#!/usr/bin/env bash
# Session 13, first call: BenchmarkTwoRanks8B's series (blocking, async,
# async with 4 in flight, async + Release) with GC counts, GOGC 100 and 200.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/ucc.test.xz" > $BIN/ucc.test; chmod +x $BIN/ucc.test
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
cd backends/ucc
for g in 100 200 100 200; do
	echo "== GOGC=$g $(date -u +%T)" >> "$R/tworanks.txt"
	GOGC=$g $BIN/ucc.test -test.run '^$' -test.bench TwoRanks8B -test.timeout 5m >> "$R/tworanks.txt" 2>&1
done
grep "GOGC\|Bench" "$R/tworanks.txt"
grep "rank 0" "$R/tworanks.txt" | head -12
tar -C "$R" -czf "$OUT/s13a.tgz" .
