#!/usr/bin/env bash
# Builds .gpu/ (scripts/gpu-bundle.sh) and .gpu/conformance.sh, the GPU run
# of the conformance suite and the perf test. On the device (GPU.md):
#   run: carry [".gpu"], kind nvidia-h200-x2, command `bash .gpu/conformance.sh`
# It runs `conftest --backend nccl` on both GPUs (world 2) and on GPU 0
# alone (world 1, CUDA_VISIBLE_DEVICES=0), the failure specs' children
# keeping their logs and dumps, `conftest fr analyze` on the skipped-
# collective dumps, then the perf test and the host-cost benchmark (with a
# CPU profile). PERF=bench skips the perf test, PERF=none both; SUITE=none
# skips the conformance runs. Everything
# comes back as one tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/gpu-bundle.sh
cat > .gpu/conformance.sh <<'RUN'
#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; ls -l /usr/lib/x86_64-linux-gnu/libnccl.so*
  cat /sys/devices/system/clocksource/clocksource0/current_clocksource; uptime; } > "$OUT/machine.txt" 2>&1
step() { local name=$1 limit=$2; shift 2; timeout "$limit" "$@"; echo "$name rc=$?" >> "$OUT/summary.txt"; }
if [ "${SUITE:-all}" = all ]; then
	GOCOLL_CONFTEST_CHILD_DIR="$OUT/children-world2" step "conftest world2" 240 \
		.gpu/conftest --backend nccl --nproc 2 --timeout 15s --run-timeout 200s --report "$OUT/world2" > "$OUT/world2.log" 2>&1
	step "fr analyze" 10 .gpu/conftest fr analyze "$OUT/children-world2/skip" > "$OUT/fr-analyze.txt" 2>&1
	CUDA_VISIBLE_DEVICES=0 GOCOLL_CONFTEST_CHILD_DIR="$OUT/children-world1" step "conftest world1" 150 \
		.gpu/conftest --backend nccl --nproc 1 --timeout 15s --run-timeout 120s --report "$OUT/world1" > "$OUT/world1.log" 2>&1
fi
PERF=${PERF:-all}
if [ "$PERF" = all ]; then
	GOCOLL_PERF=1 GOCOLL_PERF_OUT="$OUT/perf.md" step perf 200 .gpu/nccl.test -test.run "^(TestPerf|TestPerfProcesses)$" -test.v -test.count=1 > "$OUT/perf.log" 2>&1
fi
if [ "$PERF" != none ]; then
	CUDA_VISIBLE_DEVICES=0 step "bench world1" 60 .gpu/nccl.test -test.run '^$' -test.bench BenchmarkAsyncAllreduceHostCost -test.benchtime 20000x -test.count ${BENCH_COUNT:-5} \
		-test.cpuprofile "$OUT/bench.prof" > "$OUT/bench-world1.log" 2>&1
fi
cat "$OUT/summary.txt"
for f in "$OUT"/world*.log; do tail -n 4 "$f"; done; head -3 "$OUT/machine.txt" | tail -1; tail -2 "$OUT/machine.txt"
grep -h "^  FAILED" "$OUT"/world*.log | head -20
cat "$OUT/fr-analyze.txt" | head -20
[ -f "$OUT/perf.md" ] && cat "$OUT"/perf*.md
grep -h 'host-ns' "$OUT"/bench*.log 2>/dev/null
tar -C "$OUT" -czf /tmp/gpu-results.tgz . && rm -rf "$OUT"/* && mv /tmp/gpu-results.tgz "$OUT/"
RUN
chmod +x .gpu/conformance.sh
du -sh .gpu
