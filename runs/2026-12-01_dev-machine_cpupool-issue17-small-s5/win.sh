#!/bin/bash
# win.sh NAME CMD...: run CMD, and during its steady state take perf stat -a for 1 s and perf sched for 0.05 s
name=$1; shift
"$@" > /tmp/c17/$name.out 2>&1 &
pid=$!
sleep ${WARM:-2}
perf stat -a -e context-switches,cpu-migrations,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_nanosleep -o /tmp/c17/$name.stat -- sleep 1
perf sched record -o /tmp/c17/$name.sched -- sleep 0.05 >/dev/null 2>&1
wait $pid
