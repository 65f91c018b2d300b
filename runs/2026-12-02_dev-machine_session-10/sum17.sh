#!/bin/bash
# sum17.sh DIR: per-round 8 B and 4 KiB in-place times and Open MPI's, and medians per label.
d=$1
for f in $d/*-np*-r*.txt; do
  b=$(basename $f .txt)
  awk -v n=$b '$1 ~ /^[0-9]+$/ && NF>=15 {printf "%s %s %s %s\n", n, $1, $10, $17}' $f
done | sort -k1,1 -k2n > $d/summary.txt
python3 - "$d/summary.txt" <<'PY'
import sys,statistics,collections
rows=collections.defaultdict(list); mpi=collections.defaultdict(list)
for line in open(sys.argv[1]):
    n,size,t,m=line.split()
    label=n.split('-r')[0]
    rows[(label,int(size))].append(float(t)); 
    try: mpi[(label,int(size))].append(float(m))
    except: pass
for k in sorted(rows):
    v=rows[k]; goal={8:2,4096:5}.get(k[1])
    extra=f" <=goal {sum(x<=goal for x in v)}/{len(v)}" if goal else ""
    print(k, "median %.2f"%statistics.median(v), "range %.2f-%.2f"%(min(v),max(v)), extra, "mpi median %.2f"%statistics.median(mpi[k]) if mpi[k] else "")
PY
