#!/usr/bin/env bash
# The lead's end-of-session-4 re-run on the quiet 2-core machine (no other
# work running): issue 17's table with the before (9b6a529) and final trees
# taking turns, Open MPI in every invocation; cpupool 8 B with a long count;
# ucc 8 B beside the raw libucc loop, the fingerprint check on and off.
#   /tmp/ct-before: 9b6a529's conftest; /tmp/ct-after: the final tree's.
set -u
cd "$(dirname "$0")/../.."
d=runs/2026-12-01_dev-machine_end-of-session-4
SIZES=8,4K,64K,256K,1M,4M,16M,64M scripts/bench-issue17.sh $d/cpupool /tmp/ct-after /tmp/ct-before 3
for r in 1 2 3; do for v in before after; do
	{ echo "== $v r$r $(uptime)"; flock /tmp/gocoll-bench.lock /tmp/ct-$v bench --backend cpupool --nproc 2 --peers openmpi -n 0 --iters 100 --sizes 8,4096 --tune '--depth 1'; } >> $d/cpupool-8B-long.txt 2>&1
done; done
for r in 1 2 3; do for fp in auto off; do for v in before after; do
	{ echo "== $v fp=$fp r$r $(uptime)"; GOCOLL_UCC_FINGERPRINTS=$fp flock /tmp/gocoll-bench.lock /tmp/ct-$v bench --backend ucc --wrap 'scripts/ucc-run.sh --' --nproc 2 --sizes 8,64,512 --iters 50 --peers raw-ucc; } >> $d/ucc-small.txt 2>&1
done; done; done
echo done > $d/DONE
