#!/usr/bin/env bash
# ucc12e call 2 (session 6): the same binary (new) with posting ahead on
# (the default) and off (GOCOLL_UCC_FP_AHEAD=off: every op held for its
# peers' fingerprints, as main), taking turns; the check on throughout.
# Results: $OUT/ucc12e-2.tgz.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b
xz -dc "$b/conftest-new.xz" > /tmp/b/conftest-new; chmod +x /tmp/b/conftest-new
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-70}
L=$R/bench.log
step() { local label=$1 cap=$2; shift 2
	local left=$((deadline - SECONDS)); [ $left -le 6 ] && { echo "skip $label" >> "$L"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$L"
	timeout $((left < cap ? left : cap)) "$@" >> "$L" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$L"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size)
l1() { GOCOLL_UCC_FP_AHEAD=$1 step "1M 4r ahead=$1 $2" 15 /tmp/b/conftest-new bench --backend ucc --nproc 4 --sizes 1M --iters 4 "${raw[@]}" --repeat 5 --json "$R/l1-4-$1-$2.json"; }
s8() { GOCOLL_UCC_FP_AHEAD=$1 step "8B 2r ahead=$1 $2" 10 /tmp/b/conftest-new bench --backend ucc --nproc 2 --sizes 8 --iters 50 "${raw[@]}" --repeat 5 --json "$R/s8-2-$1-$2.json"; }
l1 on a; l1 off a; l1 on b; l1 off b
s8 on a; s8 off a
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^goal|^skip" "$L" | head -40
tar -C "$R" -czf "$OUT/ucc12e-2.tgz" .
