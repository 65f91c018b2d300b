#!/usr/bin/env bash
# Builds .gpu/: the cuda and nccl test binaries, test2json and run.sh, which
# the GPU machine runs (GPU.md): `run` with carry [".gpu"] and the command
# `bash .gpu/run.sh`. Results land in $OUT there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
export CGO_ENABLED=1
go test -c -o .gpu/cuda.test ./cuda
go test -c -o .gpu/nccl.test ./backends/nccl
go build -o .gpu/test2json cmd/test2json
if [ -d cmd/conftest ] && ls cmd/conftest/*.go >/dev/null 2>&1; then
	go build -o .gpu/conftest ./cmd/conftest || echo "conftest did not build; skipping it" >&2
fi
cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine. NVLink multicast stays off (GPU.md).
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
	date -u
	nvidia-smi -L
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
	ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null
	nproc
} > "$OUT/machine.txt" 2>&1
ngpu=$(nvidia-smi -L | wc -l)
# Ring buffers of output so a hang cannot eat the whole run.
t2j() { .gpu/test2json -t -p "$1" "${@:2}"; }
timeout 60 .gpu/cuda.test -test.v -test.count=1 > "$OUT/cuda.log" 2>&1; echo "cuda.test rc=$?" >> "$OUT/summary.txt"
CUDA_VISIBLE_DEVICES=0 timeout 120 .gpu/test2json -t -p github.com/gocoll/gocoll/backends/nccl .gpu/nccl.test -test.v=test2json -test.count=1 -test.timeout=115s > "$OUT/nccl-world1.json" 2> "$OUT/nccl-world1.stderr"; echo "nccl.test world1 rc=$?" >> "$OUT/summary.txt"
if [ "$ngpu" -ge 2 ]; then
	timeout 170 .gpu/test2json -t -p github.com/gocoll/gocoll/backends/nccl .gpu/nccl.test -test.v=test2json -test.count=1 -test.timeout=165s > "$OUT/nccl-world2.json" 2> "$OUT/nccl-world2.stderr"; echo "nccl.test world2 rc=$?" >> "$OUT/summary.txt"
fi
GOCOLL_PERF=1 GOCOLL_PERF_OUT="$OUT/perf.md" timeout 240 .gpu/nccl.test -test.run "^(TestPerf|TestPerfProcesses)$" -test.v -test.count=1 > "$OUT/perf.log" 2>&1; echo "perf rc=$?" >> "$OUT/summary.txt"
[ -z "${SKIP_BENCH:-}" ] && timeout 60 .gpu/nccl.test -test.run '^$' -test.bench BenchmarkAsyncAllreduceHostCost -test.benchtime 20000x -test.count 3 > "$OUT/bench.log" 2>&1; echo "bench rc=$?" >> "$OUT/summary.txt"
[ -z "${SKIP_BENCH:-}" ] && CUDA_VISIBLE_DEVICES=0 timeout 40 .gpu/nccl.test -test.run '^$' -test.bench BenchmarkAsyncAllreduceHostCost -test.benchtime 20000x -test.count 3 > "$OUT/bench-world1.log" 2>&1; echo "bench world1 rc=$?" >> "$OUT/summary.txt"
if [ -x .gpu/conftest ] && [ -n "${CONFTEST:-}" ]; then
	timeout 200 .gpu/conftest --backend nccl --nproc "$ngpu" --report "$OUT/conftest.json" > "$OUT/conftest.log" 2>&1; echo "conftest rc=$?" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
# The device returns at most a few files: pack them all.
tar -C "$OUT" -czf /tmp/gpu-results.tgz . && rm -rf "$OUT"/* && mv /tmp/gpu-results.tgz "$OUT/"
tar -C /tmp -xzf "$OUT/gpu-results.tgz" --one-top-level=res 2>/dev/null || { mkdir -p /tmp/res && tar -C /tmp/res -xzf "$OUT/gpu-results.tgz"; }
OUT=/tmp/res
for f in "$OUT"/nccl-world*.json; do
	echo "== $f"; grep -o '"Action":"\(pass\|fail\|skip\)","Package":"[^"]*","Test":"[^"]*"' "$f" | sed 's/"Package":"[^"]*",//' | sort | uniq -c | sort -rn | head -80
done
grep -h -- '--- FAIL\|panic' "$OUT"/*.log 2>/dev/null | head -30
tail -30 "$OUT/perf.log"; grep -h 'host-ns' "$OUT"/bench*.log
RUN
chmod +x .gpu/run.sh
du -sh .gpu
