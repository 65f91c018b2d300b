#!/usr/bin/env bash
# The pooled figures of docs/perf.md's "Eleventh round" from the JSON of the three calls
# (call1: main, new = new1; call2: main, new1, new2; call3: main, new2); python3 pool.py per row.
cd "$(dirname "$0")"
p() { python3 pool.py "$@"; }
echo "## 8 B, 2 ranks, check on (median of per-turn ours - raw, pooled)"
for c in 1 2 3; do for v in main new new1 new2; do ls call$c/s8-2-$v-auto-*.json >/dev/null 2>&1 && p "call$c $v" call$c/s8-2-$v-auto-*.json; done; done
p "all main" call*/s8-2-main-auto-*.json
p "all new1" call1/s8-2-new-auto-*.json call2/s8-2-new1-auto-*.json
p "all new2" call2/s8-2-new2-auto-*.json call3/s8-2-new2-auto-*.json
p "calls 2-3 main" call2/s8-2-main-auto-*.json call3/s8-2-main-auto-*.json
echo "## 8 B, 2 ranks, check off"
p "all main" call*/s8-2-main-off-*.json
p "new1 (call1)" call1/s8-2-new-off-*.json
p "new2" call2/s8-2-new2-off-*.json call3/s8-2-new2-off-*.json
echo "## 8 B, 4 ranks, check on"
p "main" call2/s8-4-main-*.json call3/s8-4-main-*.json
p "new2" call2/s8-4-new2-*.json call3/s8-4-new2-*.json
echo "## 4 ranks, 16 and 64 MiB"
p "main" call1/lg-4-main-auto-*.json call2/lg-4-main-16M_64M-a.json
p "new1+new2" call1/lg-4-new-auto-*.json call2/lg-4-new2-16M_64M-a.json
p "all builds" call1/lg-4-*-auto-*.json call2/lg-4-*-16M_64M-a.json
p "new1 check off" call1/lg-4-new-off-a.json
echo "## 4 ranks, 1 MiB"
p "main" call2/lg-4-main-1M-a.json call3/lg-4-main-1M-*.json
p "new2" call2/lg-4-new2-1M-a.json call3/lg-4-new2-1M-*.json
echo "## 2 ranks, 1-64 MiB (3 turns each)"
p "main" call2/lg-2-main-*.json
p "new2" call2/lg-2-new2-*.json
