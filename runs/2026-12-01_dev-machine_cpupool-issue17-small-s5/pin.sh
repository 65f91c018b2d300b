#!/bin/bash
# pin.sh "CPUS..." CMD...: run CMD; pin its rank processes (children running bench-rank or bench-mpi) one by one to the CPU lists given
cpus=($1); shift
"$@" > /tmp/c17/pin.out 2>&1 &
main=$!
for i in $(seq 1 200); do
  pids=$(pgrep -f 'bench-rank|bench-mpi --op' | sort -n)
  n=$(echo $pids | wc -w)
  [ "$n" -ge ${#cpus[@]} ] && break
  sleep 0.01
done
i=0; for p in $pids; do taskset -a -p -c ${cpus[$i]} $p >/dev/null; i=$((i+1)); done
wait $main
grep -E "^ +8 |BENCH2.* 0 8 " /tmp/c17/pin.out | awk "{print (\$1==\"BENCH2\") ? \$9 : \$10}"
