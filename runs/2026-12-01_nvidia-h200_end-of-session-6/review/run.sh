#!/usr/bin/env bash
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
(cd backends/nccl && timeout 120 ../../.gpu/rev/nccl.test -test.v -test.count=1 -test.timeout=115s > "$OUT/nccl-test.log" 2>&1; echo "nccl.test rc=$?")
GOCOLL_CONFTEST_CHILD_DIR=/tmp/ch timeout 150 .gpu/rev/conftest --backend nccl --nproc 1 --timeout 15s --run-timeout 140s > "$OUT/conftest-nccl.log" 2>&1; echo "conftest rc=$?"
timeout 60 .gpu/rev/conftest bench hostcost --backend nccl --reps 3 --torch-runs 0 > "$OUT/hostcost.log" 2>&1; echo "hostcost rc=$?"
grep -cE "^--- PASS" "$OUT/nccl-test.log"; grep -cE "^--- FAIL" "$OUT/nccl-test.log"; grep -cE "^--- SKIP" "$OUT/nccl-test.log"
tail -1 "$OUT/conftest-nccl.log"; grep -E "^goal|round by round" "$OUT/hostcost.log"
