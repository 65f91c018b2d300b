#!/bin/bash
# stat.sh NAME BIN: perf stat -a for 1 s of the steady state of conftest bench --backend cpupool
# --nproc 4 --peers none -n 400000 --sizes 8 --tune '--depth 1': context switches and sched_yield
# calls per op (the whole machine: on a shared one, others' switches count too).
name=$1 bin=$2 d=/tmp/c17f
flock /tmp/gocoll-bench.lock bash -c "
$bin bench --backend cpupool --nproc 4 --peers none -n 400000 --sizes 8 --tune '--depth 1' > $d/$name.out 2>&1 &
pid=\$!
sleep 1.5
perf stat -a -e context-switches,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex -o $d/$name.stat -- sleep 1
wait \$pid"
t=$(grep -E '^ +8 ' $d/$name.out | awk '{print $10}')
awk -v t=$t -v n=$name '/context-switches|sched_yield|sys_enter_futex/ {gsub(",","",$1); printf "%s: %s us/op: %s %.2f per op\n", n, t, $2, $1/(1e6/t)}' $d/$name.stat
