import json,glob,re,statistics,sys,collections
d=sys.argv[1]
rows=collections.defaultdict(list)
for f in sorted(glob.glob(d+"/*-np*-r*.txt")):
    m=re.search(r'/(\w+)-np(\d)-r(\d+)\.txt',f); lab,np,r=m.group(1),int(m.group(2)),int(m.group(3))
    for line in open(f):
        p=line.split()
        if len(p)>15 and p[0].isdigit() and p[2]=='float':
            size=int(p[0]); ours=float(p[9]); omp=float(p[-2]); x=float(p[-1])
            rows[(np,size,lab)].append((r,ours,omp,x))
for (np,size,lab),v in sorted(rows.items()):
    v.sort(); xs=[e[3] for e in v]; us=[e[1] for e in v]
    goal = (2.0 if size==8 else 5.0) if (np==2 and size<=4096) else None
    thr = 0.8 if np==4 else 1.0
    if goal: met=sum(1 for u in us if u<=goal); g=f"<= {goal} us in {met}/{len(us)}"
    else: met=sum(1 for x in xs if x>=thr); g=f">= {thr}x in {met}/{len(xs)}"
    print(f"np{np} {size:>9} {lab:6} ours med {statistics.median(us):9.2f} [{min(us):.2f}-{max(us):.2f}] x med {statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}] {g}")
