#!/usr/bin/env bash
# The fold of gn_bench_floor_cur into gn_bench_floor_cur_evs (one event):
# one hostcost round (its "current stream" C-floor rows use both) and the
# nccl tests that drive the bench loops.
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
b=$(cd "$(dirname "$0")" && pwd)
cd "$b/../.."
timeout 60 "$b/conftest" bench hostcost --backend nccl --reps 3 --torch-runs 0 > "$OUT/hostcost-fold.log" 2>&1; echo "hostcost rc=$?"
(cd backends/nccl && CUDA_VISIBLE_DEVICES=0 timeout 40 "$b/nccl.test" -test.run '^$' -test.bench 'IssueCrossing' -test.benchtime 20000x > "$OUT/crossing-fold.log" 2>&1; echo "crossing rc=$?")
grep -E '^\| nccl|^goal' "$OUT/hostcost-fold.log"; grep -E 'ns/op|FAIL|ok' "$OUT/crossing-fold.log" | head
