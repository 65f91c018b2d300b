#!/usr/bin/env bash
# Builds DIR/conftest (cgo, stripped; DIR is $1, default .gpu) and
# DIR/bench.sh, which runs `conftest bench --backend nccl` for every op
# beside raw NCCL and torch on the GPU machine (GPU.md): `run` with carry
# ["DIR"] and the command `bash DIR/bench.sh`. BENCH_ARGS replaces the size and iteration flags
# (default: -b 8 -e 1G -f 2 -c 1). The results come back as one tarball,
# $OUT/gpu-bench.tgz (tables, --json file, machine facts).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
mkdir -p "$dir"
CGO_ENABLED=1 go build -ldflags='-s -w' -o "$dir/conftest" ./cmd/conftest
cat > "$dir/bench.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine. NVLink multicast stays off (GPU.md).
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
res="$OUT/res"
mkdir -p "$res"
bin=$(dirname "$0")
ngpu=$(nvidia-smi -L | wc -l)
{
	date -u
	nvidia-smi -L
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
	ls -l /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null
	python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
	nproc
	uptime
} > "$res/machine.txt" 2>&1
start=$(date +%s)
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-200}" "$bin/conftest" bench --backend nccl --op "${BENCH_OPS:-all}" ${BENCH_ARGS:--b 8 -e 1G -f 2 -c 1} \
	--nproc "$ngpu" --json "$res/nccl.json" --note "nvidia-h200, $ngpu GPU(s), $(date -u +%FT%TZ)" > "$res/nccl.txt" 2> "$res/nccl.stderr"
echo "bench rc=$? in $(($(date +%s) - start)) s" | tee -a "$res/nccl.txt"
tail -c 3000 "$res/nccl.stderr"
cut -c1-200 "$res/nccl.txt" | grep -v '^#  \|^# time' | head -120
tar -C "$OUT" -czf "$OUT/gpu-bench.tgz" res && rm -rf "$res"
RUN
chmod +x "$dir/bench.sh"
du -sh "$dir/conftest"
