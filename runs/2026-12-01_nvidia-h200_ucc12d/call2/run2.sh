#!/usr/bin/env bash
# ucc12d call 2 (session 5) on nvidia-h200's 16 CPU cores (no GPU use):
#   1. a Go CPU profile of each of 4 ranks at 1 MiB (ours only), main and v2;
#   2. main and v2 (the landed drive loop: long C slices, lockOut) taking
#      turns: conftest bench --by-size --repeat 7, 4 ranks 1 MiB, the check
#      on; v2's 2-rank rows beside the raw loop (1-64 MiB, --repeat 3);
#      then the check off (--repeat 5) while time is left.
# Results: $OUT/ucc12d-2.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
for v in main v2; do xz -dc "$b/conftest-$v.xz" > /tmp/b/conftest-$v; chmod +x /tmp/b/conftest-$v; done
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-120}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
for v in main v2; do
	step "pprof $v 4r 1M" 10 /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 1M -n 0 --iters 8 --peers none --tune "--cpuprofile $R/p-$v-{rank}.prof"
done
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --iters 4)
l41() { local v=$1 fp=$2 rep=$3
	GOCOLL_UCC_FINGERPRINTS=$fp step "4r 1M $v $fp r$rep" 22 /tmp/b/conftest-$v bench --backend ucc --nproc 4 --sizes 1M "${raw[@]}" --repeat $rep --json "$R/l4-1m-$v-$fp.json"; }
l41 main auto 7; l41 v2 auto 7
step "2r 1M-64M v2 on" 34 /tmp/b/conftest-v2 bench --backend ucc --nproc 2 --sizes 1M,4M,16M,64M "${raw[@]}" --repeat 3 --json "$R/l2-v2.json"
l41 v2 off 5; l41 main off 5
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ |^skip" "$L" | head -80
tar -C "$R" -czf "$OUT/ucc12d-2.tgz" .
