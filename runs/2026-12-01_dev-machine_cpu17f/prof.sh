#!/bin/bash
# prof.sh NAME BIN NP N [SIZE]: perf record -a -F 10000 -g for 1 s of the steady state of
# conftest bench --backend cpupool --nproc NP --peers none -n N --sizes SIZE --tune '--depth 1',
# then CPU per op per rank outside the lane waits, by leaf symbol and by caller (prof.py).
name=$1 bin=$2 np=$3 n=$4 size=${5:-8}
d=/tmp/c17f; mkdir -p $d
flock /tmp/gocoll-bench.lock bash -c "
$bin bench --backend cpupool --nproc $np --peers none -n $n --sizes $size --tune '--depth 1' > $d/$name.out 2>&1 &
pid=\$!
sleep ${WARM:-1.5}
perf record -F 10000 -a -g -o $d/$name.data -- sleep 1 >/dev/null 2>&1
wait \$pid"
t=$(grep -E "^ +$size " $d/$name.out | awk '{print $10}')
perf script -i $d/$name.data -F comm,pid,tid,cpu,ip,sym 2>/dev/null > $d/$name.txt
python3 $(dirname $0)/prof.py $d/$name.txt $t $name $(basename $bin | cut -c1-15)
