#!/usr/bin/env bash
# Session 11, third call on nvidia-h200's CPU cores: ucc against raw libucc
# at 1-64 MiB, 2 and 4 ranks (issue 12's <= 5 % goal), main's build,
# two invocations each, every one with its own raw loop taking turns.
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
BIN=/tmp/b; mkdir -p $BIN
xz -dc "$b/conftest-new.xz" > $BIN/conftest-new; chmod +x $BIN/conftest-new
{ date -u; nproc; cat /proc/loadavg; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
for i in 1 2; do
	for n in 2 4; do
		s=$SECONDS
		timeout 135 $BIN/conftest-new bench --backend ucc --nproc $n --sizes 1M,4M,16M,64M --iters 20 --peers raw-ucc --by-size --repeat 4 \
			--raw-bin "$b/ucc-bench-raw" --json "$R/big-np$n-$i.json" > "$R/big-np$n-$i.log" 2>&1
		echo "np$n run $i rc=$? $((SECONDS - s)) s" >> "$R/summary.txt"
	done
done
for n in 2 4; do python3 scripts/ucc-pool.py "np$n" "$R"/big-np$n-*.json >> "$R/summary.txt"; done
cat /proc/loadavg >> "$R/machine.txt"
cat "$R/summary.txt"
tar -C "$R" -czf "$OUT/s11big.tgz" .
