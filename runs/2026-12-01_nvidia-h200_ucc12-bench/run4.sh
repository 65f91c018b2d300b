#!/usr/bin/env bash
# ucc12: the fingerprint check's share at 1-4 MiB, 2 ranks, final build, on/off taking turns.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd); cd "$b/../.."
source scripts/ucc-gpu-env.sh "$b/debs" > "$R/machine.txt" 2>&1 || exit 1
for r in 1 2; do for fp in auto off; do
	[ $SECONDS -ge ${DEADLINE:-14} ] && break 2
	echo "== fp=$fp r$r t=${SECONDS}s" >> "$R/bench.log"
	GOCOLL_UCC_FINGERPRINTS=$fp timeout 8 "$b/conftest-new" bench --backend ucc --nproc 2 --sizes 1M,4M --iters 2 --peers raw-ucc --raw-bin "$b/ucc-bench-raw" >> "$R/bench.log" 2>&1
done; done
grep -E "^== |^ +[0-9]+ +[0-9]+ +float" "$R/bench.log" | awk '{print $1, $2, $3, $10, $16, $18, $19}'
