#!/bin/bash
# profwhole.sh NAME BIN N: perf record -a -F 5000 -g over a whole 4-rank 8 B conftest bench run of N
# ops (start-up included, the same for every build), then CPU per op per rank of the rank processes,
# in and outside the waits, counted against the run's N ops rather than a window's rate (which a
# neighbour's load skews).
name=$1 bin=$2 n=$3 d=/tmp/c17f
flock /tmp/gocoll-bench.lock perf record -F 5000 -a -g -o $d/$name.data -- $bin bench --backend cpupool --nproc 4 --peers none -n $n -w 0 --sizes 8 --tune '--depth 1' > $d/$name.out 2>&1
perf script -i $d/$name.data -F comm,pid,tid,cpu,ip,sym 2>/dev/null > $d/$name.txt
python3 - $d/$name.txt $n $name $(basename $bin | cut -c1-15) $(grep -E '^ +8 ' $d/$name.out | awk '{print $10}') <<'PY'
import sys,re,collections
f,n,name,comm,t=sys.argv[1],int(sys.argv[2]),sys.argv[3],sys.argv[4],sys.argv[5]
W=('AwaitStamped','AwaitYield','schedYield','laneTurn','Board).Await')
tot=wait=0;cur=None;keep=False;st=[]
def flush():
    global tot,wait
    if keep and st is not None:
        tot+=1
        if any(any(w in x for w in W) for x in st): wait+=1
for line in open(f):
    if not line.strip(): continue
    m=re.match(r'^\s*(\S+)\s+(\d+)/(\d+)\s+\[(\d+)\]',line)
    if m:
        flush(); keep=(m.group(1)==comm); st=[]; continue
    s=line.strip().split(None,1)
    if len(s)>1: st.append(s[1])
flush()
sc=lambda v: v/5000/n/4*1e6
print(f"{name}: {t} us/op; whole run, {n} ops: CPU per op per rank {sc(tot):.3f} us, in waits {sc(wait):.3f}, outside {sc(tot-wait):.3f}")
PY
