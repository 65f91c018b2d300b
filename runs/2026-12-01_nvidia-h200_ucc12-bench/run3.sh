#!/usr/bin/env bash
# ucc12's last bench on nvidia-h200's 16 CPU cores (no GPU use): main's
# build before the session (base) and the final one (new) taking turns, the
# raw libucc loop in every invocation.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-45}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 5 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s" >> "$R/bench.log"
	timeout $((left < 30 ? left : 30)) "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw")
for r in 1 2; do
	for v in base new; do
		step "small $v r$r" "$b/conftest-$v" bench --backend ucc --nproc 2 --sizes 8,64,512 --iters 50 "${raw[@]}"
	done
done
step "large new" "$b/conftest-new" bench --backend ucc --nproc 2,4 --sizes 1M,4M,16M,64M --iters 4 "${raw[@]}"
tar -C "$R" -czf "$OUT/ucc12c.tgz" . && rm -rf "$R"
