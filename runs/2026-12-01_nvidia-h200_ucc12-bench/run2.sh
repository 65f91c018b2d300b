#!/usr/bin/env bash
# ucc12's second bench on nvidia-h200's 16 CPU cores (no GPU use): depth 1
# (one buffer, one op in flight, the raw loop's shape) against the default
# window, fingerprints on/off, base/new, and per-rank CPU profiles.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
{ date -u; nproc; uptime; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-170}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 12 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s" >> "$R/bench.log"
	timeout $((left < 60 ? left : 60)) "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw")
small=(--nproc 2 --sizes 8,64,512 --iters 100)
for r in 1 2; do
	for v in base new; do
		step "small $v d0 r$r" "$b/conftest-$v" bench --backend ucc "${small[@]}" "${raw[@]}"
		step "small $v d1 r$r" "$b/conftest-$v" bench --backend ucc "${small[@]}" --tune '--depth 1' "${raw[@]}"
	done
	GOCOLL_UCC_FINGERPRINTS=off step "small new-fpoff d0 r$r" "$b/conftest-new" bench --backend ucc "${small[@]}" "${raw[@]}"
	GOCOLL_UCC_FINGERPRINTS=off step "small new-fpoff d1 r$r" "$b/conftest-new" bench --backend ucc "${small[@]}" --tune '--depth 1' "${raw[@]}"
	step "large new d0 r$r" "$b/conftest-new" bench --backend ucc --nproc 2,4 --sizes 1M,4M,16M --iters 4 "${raw[@]}"
	step "large new d1 r$r" "$b/conftest-new" bench --backend ucc --nproc 2,4 --sizes 1M,4M,16M --iters 4 --tune '--depth 1' "${raw[@]}"
done
step "prof 8B new d0" "$b/conftest-new" bench --backend ucc --nproc 2 --sizes 8 --iters 200 "${raw[@]}" --tune "--cpuprofile $R/p8-{rank}.prof"
step "prof 1M new d0" "$b/conftest-new" bench --backend ucc --nproc 2 --sizes 1M --iters 8 "${raw[@]}" --tune "--cpuprofile $R/p1m-{rank}.prof"
uptime >> "$R/machine.txt"
tar -C "$R" -czf "$OUT/ucc12b.tgz" . && rm -rf "$R"
