#!/usr/bin/env bash
# ucc12c's second, short call: is the 4-rank 1 MiB gap the fingerprint
# check's? main (after the revert) with the check on and off, --by-size
# --repeat 5, then 2 ranks 4 MiB the same way while time is left.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
mkdir -p /tmp/b; xz -dc "$b/conftest-main.xz" > /tmp/b/conftest; chmod +x /tmp/b/conftest
{ date -u; uptime; } > "$R/machine.txt"
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-50}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 8 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s $(cut -d' ' -f1-3 /proc/loadavg)" >> "$R/bench.log"
	timeout $((left < 25 ? left : 25)) "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 5 --iters 4)
for fp in auto off; do
	GOCOLL_UCC_FINGERPRINTS=$fp step "4r 1M fp=$fp" /tmp/b/conftest bench --backend ucc --nproc 4 --sizes 1M "${raw[@]}" --json "$R/l4-1m-$fp.json"
done
for fp in auto off; do
	GOCOLL_UCC_FINGERPRINTS=$fp step "2r 4M fp=$fp" /tmp/b/conftest bench --backend ucc --nproc 2 --sizes 4M "${raw[@]}" --json "$R/l2-4m-$fp.json"
done
grep -E "^== |^rc=|^goal|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ |^skip" "$R/bench.log"
tar -C "$R" -czf "$OUT/ucc12c-2.tgz" .
