#!/usr/bin/env bash
# The lead's end-of-session-5 re-run on the quiet 2-core machine (nobody else
# running): issue 17's table with 8afe047 (the session's start) and the final
# tree taking turns, Open MPI in every invocation; cpupool 8 B with a long
# count; ucc 8 B beside the raw libucc loop (--by-size turns), the
# fingerprint check on and off (8afe047 has no --by-size: one turn); the dispatcher's cost alone and end to end.
#   /tmp/ct-s5-before: 8afe047's conftest; /tmp/ct-s5-after: the final tree's.
set -u
cd "$(dirname "$0")/../.."
d=runs/2026-12-01_dev-machine_end-of-session-5
SIZES=8,4K,64K,256K,1M,4M,16M,64M scripts/bench-issue17.sh $d/cpupool /tmp/ct-s5-after /tmp/ct-s5-before 10
for r in 1 2 3 4; do for v in before after; do
	{ echo "== $v r$r $(uptime)"; flock /tmp/gocoll-bench.lock /tmp/ct-s5-$v bench --backend cpupool --nproc 2 --peers openmpi -n 0 --iters 100 --sizes 8,4096 --tune '--depth 1'; } >> $d/cpupool-8B-long.txt 2>&1
done; done
for r in 1 2; do for fp in auto off; do for v in before after; do
	{ echo "== $v fp=$fp r$r $(uptime)"; GOCOLL_UCC_FINGERPRINTS=$fp flock /tmp/gocoll-bench.lock /tmp/ct-s5-$v bench --backend ucc --wrap 'scripts/ucc-run.sh --' --nproc 2 --sizes 8 --iters 50 --peers raw-ucc $([ $v = after ] && echo --by-size --repeat 3); } >> $d/ucc-small.txt 2>&1
done; done; done
OUT=$d/dispatch scripts/bench-dispatch-e2e.sh 8afe047 5 > $d/dispatch.txt 2>&1 # (run by hand with OUT=/tmp/dispe2e: the relative OUT broke the builds before the common file made it absolute)
rm -rf $d/dispatch/before-tree $d/dispatch/disp-*.test $d/dispatch/conftest-before $d/dispatch/conftest-after
echo done > $d/DONE
