#!/usr/bin/env bash
# ucc12's bench on nvidia-h200's 16 CPU cores (no GPU use): the ucc backend
# beside the raw libucc loop in the same conftest bench invocation, main's
# build (base) and this branch's (new) taking turns. Logs and JSON under $OUT.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=$OUT/r; mkdir -p "$R"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
{ date -u; nproc; uptime; lscpu | grep -E 'Model name|^CPU\(s\)|NUMA|Thread'; } > "$R/machine.txt" 2>&1
source scripts/ucc-gpu-env.sh "$b/debs" >> "$R/machine.txt" 2>&1 || { echo env failed; cat "$R/machine.txt"; exit 1; }
deadline=${DEADLINE:-300}
step() { local label=$1; shift
	local left=$((deadline - SECONDS)); [ $left -le 15 ] && { echo "skip $label" >> "$R/bench.log"; return; }
	echo "== $label t=${SECONDS}s" >> "$R/bench.log"
	timeout $((left < 100 ? left : 100)) "$@" >> "$R/bench.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$R/bench.log"; }
raw=(--peers raw-ucc --raw-bin "$b/ucc-bench-raw")
for r in ${ROUNDS:-1 2 3}; do
	for v in base new; do
		step "small $v r$r" "$b/conftest-$v" bench --backend ucc --nproc 2,4 --sizes 8,64,512,4K --iters 100 "${raw[@]}" --json "$R/small-$v-r$r.json"
	done
	GOCOLL_UCC_FINGERPRINTS=off step "small new-fpoff r$r" "$b/conftest-new" bench --backend ucc --nproc 2 --sizes 8,64,512,4K --iters 100 "${raw[@]}" --json "$R/small-newoff-r$r.json"
	for v in base new; do
		step "large $v r$r" "$b/conftest-$v" bench --backend ucc --nproc 2,4 --sizes 1M,4M,16M,64M --iters 4 "${raw[@]}" --json "$R/large-$v-r$r.json"
	done
done
uptime >> "$R/machine.txt"
grep -E "^== |^rc=|^ +[0-9]+ +[0-9]+ +float|ranks|goal" "$R/bench.log" | cut -c1-20,100-400 | head -150
tar -C "$R" -czf "$OUT/ucc12.tgz" . 
