#!/bin/bash
# ab.sh ROUNDS label=cmd ...   (each cmd is a conftest binary, optionally with env: "ENV=x bin")
R=$1; shift
for i in $(seq $R); do
  line=""
  for spec in "$@"; do
    l=${spec%%=*}; c=${spec#*=}
    v=$(env $c bench --backend cpupool --nproc ${NP:-4} --peers none -n ${N:-100000} --sizes ${SZ:-8} --tune '--depth 1' 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +float" | awk '{print $10}')
    line="$line $l $v"
    echo "$l $v" >> /tmp/ab.raw
  done
  echo "$line"
done
