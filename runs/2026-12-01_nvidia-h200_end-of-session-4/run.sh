#!/usr/bin/env bash
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/r"
R=$OUT/r
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null; nproc; } > "$R/machine.txt" 2>&1
step() { local name=$1 limit=$2; shift 2; timeout "$limit" "$@" > "$R/$name.log" 2>&1; echo "$name rc=$? $(grep -E 'passed|failed|^ok|^FAIL|^PASS' "$R/$name.log" | tail -1)" >> "$R/summary.txt"; }
GOCOLL_CONFTEST_CHILD_DIR="$R/children" step conftest-nccl-world1 150 \
	.gpu/final/conftest --backend nccl --nproc 1 --timeout 15s --run-timeout 140s --report "$R/conftest-nccl-world1"
(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 step nccl-test-world1 120 ../../.gpu/final/nccl.test -test.v -test.count=1 -test.timeout=115s)
sem='(stream || async || lifetime) && !stress && !timeout'
ops='ops && !stress && !timeout'
stage() { local name=$1 be=$2 lf=$3 focus=${4:-}
	step "$name" 22 .gpu/final/conftest --backend "$be" --nproc 1 --label-filter "$lf" ${focus:+--focus "$focus"} --timeout 10s --run-timeout 20s --report "$R/$name"; }
stage cpupool-stream "cpu:cpupool,cuda:cpupool" "$sem"
stage cpupool-ops "cpu:cpupool,cuda:cpupool" "$ops" float32
if source scripts/ucc-gpu-env.sh .gpu/final/debs > "$R/ucc-env.log" 2>&1; then
	stage ucc-stream "cpu:ucc,cuda:ucc" "$sem"
	stage ucc-ops "cpu:ucc,cuda:ucc" "$ops" float32
else
	echo "ucc: scripts/ucc-gpu-env.sh failed (see ucc-env.log)" >> "$R/summary.txt"
fi
# Issue 16 item 3: host cost per call, both stream modes, beside NCCL's own
# call and torch 2.11, two invocations (the machine drifts between them).
for i in 1 2; do
	step hostcost-$i 80 .gpu/final/conftest bench hostcost --backend nccl --reps 5 --torch-runs 1 --json "$R/hostcost-$i.json"
done
cat "$R/summary.txt"
for f in "$R"/hostcost-*.log; do echo "== $(basename "$f")"; grep -E '^goal|round by round|^\| (nccl raw|nccl \+|backend async|dispatcher async\+Wait|torch)' "$f"; done
grep -hE '^\s*\[FAIL\]|--- FAIL|panic:' "$R"/*.log | head -20
rm -rf "$R/children"
tar -C "$R" -czf "$OUT/final.tgz" . && rm -rf "$R"
