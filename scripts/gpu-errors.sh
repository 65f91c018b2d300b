#!/usr/bin/env bash
# Builds .gpu/ (scripts/gpu-bundle.sh) and .gpu/errors.sh, the GPU run of
# issue 6's specs: it regenerates the NaN-check PTX with nvcc (returned in
# $OUT), runs the nccl tests with it on every GPU (the error, timeout,
# heartbeat and NaN specs among them), and `conftest fr analyze` on the
# dumps of the skipped-collective spec. On the device:
#   run: carry [".gpu"], kind nvidia-h200-x2, command `bash .gpu/errors.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/gpu-bundle.sh
cat > .gpu/errors.sh <<'RUN'
#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{ date -u; nvidia-smi -L; ls -l /usr/lib/x86_64-linux-gnu/libnccl.so*; } > "$OUT/machine.txt" 2>&1
bash scripts/gen-nan-ptx.sh > "$OUT/ptx.log" 2>&1; echo "ptx rc=$?" >> "$OUT/summary.txt"
export GOCOLL_NCCL_NAN_CHECK_PTX=$PWD/backends/nccl/kernels/nan_check.ptx
export GOCOLL_ERR_OUT="$OUT/err"
mkdir -p "$GOCOLL_ERR_OUT"
T2J=".gpu/test2json -t -p github.com/gocoll/gocoll/backends/nccl"
timeout 200 $T2J .gpu/nccl.test -test.v=test2json -test.count=1 -test.timeout=195s > "$OUT/nccl-world2.json" 2> "$OUT/nccl-world2.stderr"; echo "nccl.test world2 rc=$?" >> "$OUT/summary.txt"
CUDA_VISIBLE_DEVICES=0 timeout 120 $T2J .gpu/nccl.test -test.v=test2json -test.count=1 -test.timeout=115s > "$OUT/nccl-world1.json" 2> "$OUT/nccl-world1.stderr"; echo "nccl.test world1 rc=$?" >> "$OUT/summary.txt"
.gpu/conftest fr analyze "$GOCOLL_ERR_OUT/skip" > "$OUT/fr-analyze.txt" 2>&1; echo "conftest fr analyze rc=$?" >> "$OUT/summary.txt"
cat "$OUT/summary.txt" "$OUT/fr-analyze.txt"
for f in "$OUT"/nccl-world*.json; do
	echo "== $f"; grep -o '"Action":"\(pass\|fail\|skip\)","Package":"[^"]*","Test":"[^"]*"' "$f" | sed 's/"Package":"[^"]*",//' | sort | uniq -c | sort -rn | grep -v '"pass"' | head -40
	grep -c '"Action":"pass"' "$f"
done
grep -h '"Action":"output"' "$OUT"/nccl-world*.json | grep -E 'FAIL|errors_test|nan_test|panic' | sed 's/.*"Output":"//' | head -80
tar -C "$OUT" -czf /tmp/gpu-results.tgz . && rm -rf "$OUT"/* && mv /tmp/gpu-results.tgz "$OUT/"
RUN
chmod +x .gpu/errors.sh
du -sh .gpu
