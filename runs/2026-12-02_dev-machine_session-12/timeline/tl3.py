import sys, statistics as st
ghz=float(sys.argv[1])
for f in sys.argv[2:]:
    x=[tuple(map(int,l.split())) for l in open(f)][1000:]
    cy=[(x[i+1][0]-x[i][0])/ghz for i in range(len(x)-1)]
    n=len(cy); tot=sum(cy); s=sorted(cy)
    out=f"{f.split('/')[-1]:22s} n {n} mean {tot/n:6.0f} p50 {s[n//2]:5.0f} p90 {s[int(.9*n)]:5.0f} p99 {s[int(.99*n)]:6.0f} |"
    for lo,hi in [(0,1000),(1000,2000),(2000,10000),(10000,100000),(100000,1e12)]:
        b=[c for c in cy if lo<=c<hi]
        out+=f" [{lo/1000:g}-{hi/1000:g}us) {len(b)} {sum(b)/n:5.0f}ns/op |"
    print(out)
