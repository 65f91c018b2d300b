#!/usr/bin/env bash
# Builds .gpu/stage/ for proving, on the GPU machine, the staged CUDA
# tensors of cpupool and ucc (internal/stage): conftest, the sid libucc
# .debs (scripts/ucc-debs.sh) and run.sh. The lead runs it there with
# carry [".gpu/stage"] and the command `bash .gpu/stage/run.sh`; results
# land in $OUT (summary.txt, the conftest logs and JSON reports).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/stage/conftest .gpu/stage/run.sh
mkdir -p .gpu/stage
export CGO_ENABLED=1
go build -trimpath -ldflags=-s -o .gpu/stage/conftest ./cmd/conftest
if ! ls .gpu/stage/debs/libucc1_*.deb >/dev/null 2>&1; then
	scripts/ucc-debs.sh .gpu/stage/debs
fi
cat > .gpu/stage/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine (no Go, no libucc): conftest on one rank with the
# backend strings "cpu:cpupool,cuda:cpupool" and "cpu:ucc,cuda:ucc", the
# staged stream specs (labels stream, async, lifetime) and the float32 op
# specs; each run is bounded at 22 s, so the whole script ends within 90 s.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
{ date -u; nvidia-smi -L; } > "$OUT/machine.txt" 2>&1
sem='(stream || async || lifetime) && !stress && !timeout'
ops='ops && !stress && !timeout'
run() { # name backend label-filter [focus]
	local name=$1 be=$2 lf=$3 focus=${4:-}
	timeout 22 .gpu/stage/conftest --backend "$be" --nproc 1 --label-filter "$lf" ${focus:+--focus "$focus"} \
		--timeout 10s --run-timeout 20s --report "$OUT/$name" > "$OUT/$name.log" 2>&1
	echo "$name rc=$? $(grep -E 'passed|failed' "$OUT/$name.log" | tail -1)" >> "$OUT/summary.txt"
}
run cpupool-stream "cpu:cpupool,cuda:cpupool" "$sem"
run cpupool-ops "cpu:cpupool,cuda:cpupool" "$ops" 'float32'
if source scripts/ucc-gpu-env.sh .gpu/stage/debs > "$OUT/ucc-env.log" 2>&1; then
	run ucc-stream "cpu:ucc,cuda:ucc" "$sem"
	run ucc-ops "cpu:ucc,cuda:ucc" "$ops" 'float32'
else
	echo "ucc: scripts/ucc-gpu-env.sh failed (see ucc-env.log)" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
for f in "$OUT"/*.log; do
	echo "== $f"
	grep -E '\[FAIL\]|\[PANICKED\]|staged|panic' "$f" | head -20
done
RUN
chmod +x .gpu/stage/run.sh
du -sh .gpu/stage
