#!/usr/bin/env bash
# ucc12b: one build (main + inert experiment knobs), variants taking turns,
# the raw libucc loop in every invocation. nvidia-h200's 16 cores, no GPU use.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-80}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 4 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s load=$(cut -d' ' -f1 /proc/loadavg)" >> "$R/bench.log"
	timeout $((left < 20 ? left : 20)) env "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
c=(bench --backend ucc --nproc 2 --sizes 8,64,512 --iters 50 --peers raw-ucc --raw-bin "$b/ucc-bench-raw")
x="$b/conftest-exp"
for r in 1 2 3; do
	step "default r$r" "$x" "${c[@]}"
	step "fpoff r$r" GOCOLL_UCC_FINGERPRINTS=off "$x" "${c[@]}"
	step "np1ours r$r" GOCOLL_UCC_EXP_NPOLLS=1 "$x" "${c[@]}"
	step "np1ours-fpoff r$r" GOCOLL_UCC_EXP_NPOLLS=1 GOCOLL_UCC_FINGERPRINTS=off "$x" "${c[@]}"
	step "np1both r$r" UCC_TL_UCP_NPOLLS=1 "$x" "${c[@]}"
	step "lock r$r" GOCOLL_EXP_LOCK=1 "$x" "${c[@]}"
	step "gomaxprocs2 r$r" GOMAXPROCS=2 "$x" "${c[@]}"
	step "combo r$r" GOMAXPROCS=2 GOCOLL_EXP_LOCK=1 GOCOLL_UCC_EXP_NPOLLS=1 "$x" "${c[@]}"
done
tar -C "$R" -czf "$OUT/ucc12b.tgz" . && rm -rf "$R"
