#!/usr/bin/env bash
# End of session 4: the proof run (run.sh), then the ucc bench on the 16
# CPU cores beside the raw libucc loop (issue 12 item 4), bounded to 110 s.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b=$(cd "$(dirname "$0")" && pwd)
bash "$b/run.sh"
cd "$b/../.."
U=$OUT/u; mkdir -p "$U"
source scripts/ucc-gpu-env.sh "$b/debs" > "$U/env.log" 2>&1 || { echo ucc env failed; exit 0; }
start=$SECONDS
step() { local label=$1; shift; local left=$((110 - (SECONDS - start))); [ $left -le 5 ] && { echo "skip $label" >> "$U/bench.log"; return; }
	echo "== $label t=$((SECONDS-start)) load=$(cut -d' ' -f1 /proc/loadavg)" >> "$U/bench.log"
	timeout $((left < 40 ? left : 40)) env "$@" >> "$U/bench.log" 2>&1; echo "rc=$?" >> "$U/bench.log"; }
c=(bench --backend ucc --peers raw-ucc --raw-bin "$b/ucc-bench-raw")
for r in 1 2 3; do
	step "8B fp=auto r$r" "$b/conftest" "${c[@]}" --nproc 2 --sizes 8,64,512 --iters 50
	step "8B fp=off r$r" GOCOLL_UCC_FINGERPRINTS=off "$b/conftest" "${c[@]}" --nproc 2 --sizes 8,64,512 --iters 50
done
step "large r1" "$b/conftest" "${c[@]}" --nproc 2,4 --sizes 1M,4M,16M,64M --iters 4 --repeat 2
grep -E "^== |^rc=|^ *8 |goal" "$U/bench.log" | head -60
tar -C "$U" -czf "$OUT/ucc.tgz" . && rm -rf "$U"
