#!/usr/bin/env bash
# Regenerates backends/nccl/kernels/nan_check.ptx from nan_check.cu. Run it
# on the GPU machine, where nvcc is (/usr/local/cuda/bin/nvcc); with OUT set
# the PTX is also copied there so that it comes back with the run's files:
#   run: bash scripts/gen-nan-ptx.sh
# compute_75 PTX (the oldest target of CUDA 13): the driver compiles it for the device it loads on.
set -euo pipefail
cd "$(dirname "$0")/../backends/nccl/kernels"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
"$NVCC" --version | tail -2
"$NVCC" -ptx -O3 -arch=compute_75 -o nan_check.ptx nan_check.cu || "$NVCC" -ptx -O3 -arch=compute_90 -o nan_check.ptx nan_check.cu
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT" && cp nan_check.ptx "$OUT/nan_check.ptx"
fi
wc -c nan_check.ptx
