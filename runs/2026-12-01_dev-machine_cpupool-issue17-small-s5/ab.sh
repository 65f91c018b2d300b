#!/bin/bash
# ab.sh ROUNDS NP N BIN... : alternate the binaries, ROUNDS each, --peers none -n N --sizes 8; print per-binary sorted times
rounds=$1 np=$2 n=$3; shift 3
declare -A res
for r in $(seq 1 $rounds); do
  for b in "$@"; do
    t=$(flock /tmp/gocoll-bench.lock $b bench --backend cpupool --nproc $np --peers none -n $n --sizes ${SZ:-8} --tune "--depth 1 ${XT:-}" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +float" | awk '{printf "%s ", $10}')
    res[$b]="${res[$b]} $t"
  done
done
for b in "$@"; do echo "$(basename $b): $(echo ${res[$b]} | tr ' ' '\n' | sort -g | tr '\n' ' ')"; done
