#!/bin/bash
# quiet.sh CMD...: wait (up to QUIET_MAX s) until both cores were >= QUIET_IDLE % idle over 1 s, then run CMD under the bench lock
max=${QUIET_MAX:-120}; want=${QUIET_IDLE:-85}
exec 9>/tmp/gocoll-bench.lock
flock 9
t0=$(date +%s)
while :; do
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  tot=0; for i in 1 2 3 4 5 6 7 8; do tot=$((tot + ${b[$i]} - ${a[$i]})); done
  idle=$(( (${b[4]} - ${a[4]}) * 100 / (tot>0?tot:1) ))
  [ $idle -ge $want ] && break
  [ $(( $(date +%s) - t0 )) -ge $max ] && { echo "# not quiet (idle $idle %)" >&2; break; }
done
echo "# idle $idle % before the run" >&2
"$@"
