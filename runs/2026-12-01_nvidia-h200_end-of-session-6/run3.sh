#!/usr/bin/env bash
# End of session 5: the proof run (run.sh: nccl conformance and tests, the
# staged CUDA specs of cpupool and ucc, two hostcost rounds), then issue 12
# item 4's set on the 16 CPU cores with conftest bench --by-size (ours and the
# raw libucc loop taking turns per size), bounded to 230 s.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b=$(cd "$(dirname "$0")" && pwd)
bash "$b/run.sh"
cd "$b/../.."
U=$OUT/u; mkdir -p "$U"
source scripts/ucc-gpu-env.sh "$b/debs" > "$U/env.log" 2>&1 || { echo ucc env failed; exit 0; }
start=$SECONDS
step() { local label=$1; shift; local left=$((230 - (SECONDS - start))); [ $left -le 5 ] && { echo "skip $label" >> "$U/bench.log"; return; }
	echo "== $label t=$((SECONDS-start)) load=$(cut -d' ' -f1 /proc/loadavg)" >> "$U/bench.log"
	timeout $((left < 90 ? left : 90)) env "$@" >> "$U/bench.log" 2>&1; echo "rc=$?" >> "$U/bench.log"; }
c=(bench --backend ucc --peers raw-ucc --raw-bin "$b/ucc-bench-raw" --by-size --repeat 5)
step "8B fp=auto" "$b/conftest" "${c[@]}" --nproc 2 --sizes 8 --iters 50 --json "$U/small-on.json"
step "8B fp=off" GOCOLL_UCC_FINGERPRINTS=off "$b/conftest" "${c[@]}" --nproc 2 --sizes 8 --iters 50 --json "$U/small-off.json"
step "large 4r fp=auto" "$b/conftest" "${c[@]}" --nproc 4 --sizes 1M,4M,16M,64M --iters 4 --json "$U/large4.json"
step "large 2r fp=auto" "$b/conftest" "${c[@]}" --nproc 2 --sizes 1M,4M,16M,64M --iters 4 --json "$U/large2.json"
grep -E "^== |^rc=|^goal|^skip" "$U/bench.log" | head -60
tar -C "$U" -czf "$OUT/ucc.tgz" . && rm -rf "$U"
