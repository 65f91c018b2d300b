#!/bin/bash
# nw2.sh NAME BIN NP N: perf record -a -F 10000 -g for 1 s of the steady state; per rank process, CPU per op outside waits (µs)
name=$1 bin=$2 np=$3 n=$4
flock /tmp/gocoll-bench.lock bash -c "
$bin bench --backend cpupool --nproc $np --peers none -n $n --sizes 8 --tune '--depth 1' > /tmp/c17/$name.out 2>&1 &
pid=\$!
sleep ${WARM:-1.5}
perf record -F 10000 -a -g -o /tmp/c17/$name.data -- sleep 1 >/dev/null 2>&1
wait \$pid"
t=$(grep -E "^ +8 " /tmp/c17/$name.out | awk '{print $10}')
perf script -i /tmp/c17/$name.data -F pid,tid,cpu,ip,sym 2>/dev/null > /tmp/c17/$name.txt
python3 - /tmp/c17/$name.txt $t $name <<'PY'
import sys,re,collections
f,t,name=sys.argv[1],float(sys.argv[2]),sys.argv[3]
samples=[];cur=None
for line in open(f):
    if not line.strip(): continue
    m=re.match(r'^\s*(\d+)/(\d+)\s+\[(\d+)\]',line)
    if m: cur=[m.group(1),[]]; samples.append(cur); continue
    s=line.strip().split(None,1)
    if len(s)>1 and cur: cur[1].append(s[1])
tot=collections.Counter(); wait=collections.Counter(); cat=collections.defaultdict(collections.Counter)
W=('awaitStamp','AwaitStamped','AwaitYield','schedYield','sys_sched_yield')
for pid,st in samples:
    tot[pid]+=1
    if any(any(w in x for w in W) for x in st): wait[pid]+=1; continue
    c='other'
    for key,pat in (('dispatcher','dispatcher.'),('lanesend','LaneSend'),('lanerecv','LaneRecv'),('issue','cpupool.(*Backend).Allreduce'),('runjob','cpupool.(*Backend).runJob'),('wait','cpupool.(*work).Wait'),('gc','gcBgMark'),('bench','main.')):
        if any(pat in x for x in st): c=key;break
    cat[pid][c]+=1
ops=1e6/t  # ops in the 1 s window
print(f"{name}: {t} us/op")
for pid,n in tot.most_common(6):
    if n<500: continue
    nw=n-wait[pid]
    print(f"  pid {pid}: cpu/op {n/10000/ops*1e6:.2f} us, outside waits {nw/10000/ops*1e6:.2f} us:", ' '.join(f"{k}={v/10000/ops*1e6:.2f}" for k,v in cat[pid].most_common()))
PY
