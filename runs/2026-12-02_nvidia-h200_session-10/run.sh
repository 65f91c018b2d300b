#!/usr/bin/env bash
# Session 10 on nvidia-h200: the conformance suite with the blocking-form
# spec, on nccl (world 1) and on the staged CUDA paths of cpupool and ucc.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; ls -l /usr/lib/x86_64-linux-gnu/libnccl.so*; uptime; } > "$OUT/machine.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 GOCOLL_CONFTEST_CHILD_DIR="$OUT/children-world1" timeout 170 \
	.gpu/s10/conftest --backend nccl --nproc 1 --timeout 15s --run-timeout 160s --report "$OUT/nccl-world1" > "$OUT/nccl-world1.log" 2>&1
echo "nccl-world1 rc=$? $(grep -E 'passed|failed' "$OUT/nccl-world1.log" | tail -1)" >> "$OUT/summary.txt"
sem='(stream || async || lifetime) && !stress && !timeout'
ops='ops && !stress && !timeout'
run() { # name backend label-filter [focus]
	local name=$1 be=$2 lf=$3 focus=${4:-}
	timeout 40 .gpu/s10/conftest --backend "$be" --nproc 1 --label-filter "$lf" ${focus:+--focus "$focus"} \
		--timeout 10s --run-timeout 35s --report "$OUT/$name" > "$OUT/$name.log" 2>&1
	echo "$name rc=$? $(grep -E 'passed|failed' "$OUT/$name.log" | tail -1)" >> "$OUT/summary.txt"
}
run cpupool-stream "cpu:cpupool,cuda:cpupool" "$sem"
run cpupool-ops "cpu:cpupool,cuda:cpupool" "$ops" 'float32'
if source scripts/ucc-gpu-env.sh .gpu/s10/debs > "$OUT/ucc-env.log" 2>&1; then
	run ucc-stream "cpu:ucc,cuda:ucc" "$sem"
	run ucc-ops "cpu:ucc,cuda:ucc" "$ops" 'float32'
else
	echo "ucc: scripts/ucc-gpu-env.sh failed (see ucc-env.log)" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
for f in "$OUT"/*.log; do
	echo "== $f"
	grep -E '\[FAIL\]|\[PANICKED\]|blocking forms|panic' "$f" | head -20
done
