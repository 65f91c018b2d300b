#!/usr/bin/env bash
# More rounds of the final tree alone (after final-bench.sh), the machine still quiet.
set -u
cd "$(dirname "$0")/../.."
d=runs/2026-12-01_dev-machine_end-of-session-4
SIZES=8,4K,64K,256K,1M,4M,16M,64M scripts/bench-issue17.sh $d/cpupool-more /tmp/ct-after "" 7
for r in 1 2 3 4 5; do
	{ echo "== after r$r $(uptime)"; flock /tmp/gocoll-bench.lock /tmp/ct-after bench --backend cpupool --nproc 2 --peers openmpi -n 0 --iters 100 --sizes 8,4096 --tune '--depth 1'; } >> $d/cpupool-8B-long-more.txt 2>&1
done
echo done > $d/DONE-more
