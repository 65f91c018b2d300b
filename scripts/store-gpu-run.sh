#!/bin/sh
# Runs torch 2.x (the GPU machine's python3) against gocoll's TCPStore
# server: python/store_torch211_check.py. Build first, on the dev machine:
#   CGO_ENABLED=0 go build -o .gpu/store/gocoll-store ./cmd/gocoll-store
# then call the device tool's run with carry [".gpu/store"] and the command
#   sh scripts/store-gpu-run.sh
# ENGINE=ring or goroutines picks the server's engine (default auto).
set -u
OUT=${OUT:-/tmp/store-gpu-out}
mkdir -p "$OUT"
PORT=${PORT:-29611}
export NCCL_NVLS_ENABLE=0
{
	date -u +"date: %Y-%m-%dT%H:%M:%SZ"
	echo "host: $(hostname), $(nproc) cores"
	echo "kernel: $(uname -r), io_uring_disabled=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo n/a)"
	.gpu/store/gocoll-store serve --addr 127.0.0.1:$PORT --engine "${ENGINE:-auto}" >"$OUT/server.log" 2>&1 &
	SP=$!
	sleep 0.5
	timeout 170 python3 python/store_torch211_check.py 127.0.0.1 $PORT
	RC=$?
	kill -INT $SP
	wait $SP
	echo "exit: $RC"
	echo "--- gocoll-store server log"
	cat "$OUT/server.log"
} 2>&1 | tee "$OUT/store-torch211.log"
