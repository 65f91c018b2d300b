import sys,re,collections
f,t,name,comm=sys.argv[1],float(sys.argv[2]),sys.argv[3],sys.argv[4]
samples=[];cur=None
for line in open(f):
    if not line.strip(): continue
    m=re.match(r'^\s*(\S+)\s+(\d+)/(\d+)\s+\[(\d+)\]',line)
    if m:
        cur=[m.group(2),[]]
        if m.group(1)==comm: samples.append(cur)
        continue
    s=line.strip().split(None,1)
    if len(s)>1 and cur: cur[1].append(s[1].replace('github.com/gocoll/gocoll/',''))
tot=collections.Counter()
for pid,st in samples: tot[pid]+=1
pids=[p for p,n in tot.most_common() if n>=500][:8]
W=('AwaitStamped','AwaitYield','schedYield','laneTurn','Board).Await')
ops=1e6/t
nr=len(pids)
leaf=collections.Counter(); incl=collections.Counter(); waitn=0; alln=0
for pid,st in samples:
    if pid not in pids: continue
    alln+=1
    if any(any(w in x for w in W) for x in st): waitn+=1; continue
    leaf[st[0] if st else '?']+=1
    for x in set(st): incl[x]+=1
scale=lambda v: v/10000/ops*1e6/nr
print(f"{name}: {t} us/op, {nr} rank processes; per op per rank: cpu {scale(alln):.3f} us, in waits {scale(waitn):.3f}, outside {scale(alln-waitn):.3f}")
print("leaf (self) outside waits:")
for k,v in leaf.most_common(40): print(f"  {scale(v):.3f} {k}")
print("inclusive outside waits:")
for k,v in incl.most_common(60): print(f"  {scale(v):.3f} {k}")
