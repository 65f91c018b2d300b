#!/usr/bin/env bash
# Session 3's final quiet-machine figures (lead), every invocation under the bench lock.
cd /work/main
B=/tmp/s3/conftest
O=/tmp/s3/out; mkdir -p $O
go build -o $B ./cmd/conftest || exit 1
run() { local name=$1; shift; { date -u +%FT%TZ; uptime; echo "+ conftest $*"; } > $O/$name.txt; flock /tmp/gocoll-bench.lock $B "$@" --json $O/$name.json >> $O/$name.txt 2>&1; echo "$name rc=$?" >> $O/summary.txt; }
S=8,4K,64K,256K,1M,16M,64M
for r in 1 2; do
  run cpupool-np2-d1-r$r bench --backend cpupool --nproc 2 --peers openmpi,gloo -n 0 --sizes $S --tune '--depth 1' --note "lead s3 final r$r"
  run cpupool-np4-d1-r$r bench --backend cpupool --nproc 4 --peers openmpi -n 0 --sizes $S --tune '--depth 1' --note "lead s3 final r$r"
done
run cpupool-np2-default bench --backend cpupool --nproc 2 --peers openmpi -n 0 --sizes $S --note "lead s3 final, default depth"
U=8,64,4K,64K,256K,1M,4M,16M,64M
for r in 1 2; do
  run ucc-np2-r$r bench --backend ucc --wrap 'scripts/ucc-run.sh --' --nproc 2 --sizes $U --peers raw-ucc,openmpi --note "lead s3 final r$r"
  GOCOLL_UCC_FINGERPRINTS=off run ucc-np2-fpoff-r$r bench --backend ucc --wrap 'scripts/ucc-run.sh --' --nproc 2 --sizes $U --peers raw-ucc,openmpi --note "lead s3 final fp off r$r"
done
run ucc-np4 bench --backend ucc --wrap 'scripts/ucc-run.sh --' --nproc 4 --sizes 8,4K,64K,1M,16M --iters 0.05 --peers raw-ucc,openmpi --note "lead s3 final"
echo done >> $O/summary.txt
