#!/bin/bash
# usage: runexp.sh N [EXP_INIT]
n=$1; port=$((20000 + RANDOM % 10000))
for r in $(seq 0 $((n-1))); do
  env RANK=$r WORLD_SIZE=$n MASTER_PORT=$port ${2:+EXP_INIT=$2} timeout 20 "${INITEXP:-/tmp/ucc12c/initexp}" --sizes 8 --iters 0.01 --shm /dev/shm/ucc12c-exp-$port &
done
wait
