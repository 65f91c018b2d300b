#!/usr/bin/env bash
# Builds .gpu/conftest and .gpu/nvml.sh, the GPU machine's proof of the NVML
# features (issue 13): `conftest gpus`, a conformance run whose reports carry
# the machine section (one rank per visible GPU, found through NVML), the
# refusals of two ranks on one GPU, a UUID in CUDA_VISIBLE_DEVICES, the
# gated-timeout policy specs whose errors and dumps carry the NVML snapshot,
# the same with GOCOLL_NVML=0 (the one-line degradation) and a short bench
# with its machine section. On the device (GPU.md):
#   run: carry [".gpu"], command `bash .gpu/nvml.sh` (nvml.sh finds conftest beside
#   itself, so the two files may travel in any carried folder)
# Everything comes back as one tarball, $OUT/nvml.tgz.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
CGO_ENABLED=1 go build -ldflags='-s -w' -o .gpu/conftest ./cmd/conftest 2> >(grep -v 'deprecat\|cgo-gcc-prolog\|nvml.h\|^ *[0-9]* |\|^ *|\|In file included\|^# github.com/NVIDIA' >&2)
cat > .gpu/nvml.sh <<'RUN'
#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
R=/tmp/nvml-res
rm -rf "$R"; mkdir -p "$R"
C="$(cd "$(dirname "$0")" && pwd)/conftest" # the bundle may travel as .gpu or as a folder of another checkout
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS; timeout "$limit" "$@"; echo "$name rc=$? ($((SECONDS-t0)) s)" >> "$R/summary.txt"; }
{ date -u; nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,clocks_throttle_reasons.active --format=csv; } > "$R/nvidia-smi.txt" 2>&1
step "gpus" 20 $C gpus > "$R/gpus.txt" 2>&1
step "gpus --json" 20 $C gpus --json --listen 500ms > "$R/gpus.json" 2>"$R/gpus-json.stderr"
step "gpus GOCOLL_NVML=0" 10 env GOCOLL_NVML=0 $C gpus > "$R/gpus-nvml-off.txt" 2>&1
step "refuse --nproc 2 on 1 GPU" 20 $C --backend nccl --nproc 2 > "$R/refuse-nproc2.txt" 2>&1
step "refuse CUDA_VISIBLE_DEVICES=0,0" 20 env CUDA_VISIBLE_DEVICES=0,0 $C --backend nccl > "$R/refuse-cvd-dup.txt" 2>&1
GOCOLL_CONFTEST_CHILD_DIR="$R/children" step "conftest world1 (no --nproc)" 120 \
	$C --backend nccl --timeout 15s --run-timeout 110s --report "$R/world1" > "$R/world1.log" 2>&1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
CUDA_VISIBLE_DEVICES="$UUID" GOCOLL_CONFTEST_CHILD_DIR="$R/children-uuid" step "conftest CUDA_VISIBLE_DEVICES=UUID, policy specs" 60 \
	$C --backend nccl --focus 'never starts' --run-timeout 50s --report "$R/uuid" > "$R/uuid.log" 2>&1
GOCOLL_NVML=0 GOCOLL_CONFTEST_CHILD_DIR="$R/children-nvml-off" step "conftest GOCOLL_NVML=0, policy specs" 60 \
	$C --backend nccl --focus 'never starts' --run-timeout 50s --report "$R/nvml-off" > "$R/nvml-off.log" 2>&1
step "bench cpupool (machine section)" 40 $C bench --nproc 2 --sizes 8,1M --iters 0.2 > "$R/bench.log" 2>&1
cat "$R/summary.txt"; cat "$R/gpus.txt"; head -12 "$R/world1.log"; tail -3 "$R/world1.log"; tail -2 "$R/uuid.log" "$R/nvml-off.log"
cat "$R/refuse-nproc2.txt" "$R/refuse-cvd-dup.txt" "$R/gpus-nvml-off.txt"
grep -h -o 'NVML[^"]*' "$R"/children/*CleanUp*/child0.log 2>/dev/null | head -2
ls -R "$R/children" | head -40
tar -C "$R" -czf "$OUT/nvml.tgz" .
RUN
chmod +x .gpu/nvml.sh
du -sh .gpu
