import sys, collections
ghz=float(sys.argv[1])
for f in sys.argv[2:]:
    x=[tuple(map(int,l.split())) for l in open(f)][1000:]
    cy=[(x[i+1][0]-x[i][0])/ghz for i in range(len(x)-1)]
    w=[(d-p)/ghz for e,p,d in x][:-1]
    g=[(x[i+1][0]-x[i][2])/ghz for i in range(len(x)-1)]
    ip=[(p-e)/ghz for e,p,d in x][:-1]
    h=collections.Counter(int(c//100) for c in cy if c<2000)
    print(f.split('/')[-1], ' '.join(f"{k/10:.1f}:{h[k]}" for k in sorted(h)))
    # for slow body ops (1-2us), which component is larger?
    sl=[i for i in range(len(cy)) if 1000<=cy[i]<2000]; fa=[i for i in range(len(cy)) if cy[i]<1000]
    import statistics as st
    for name,idx in (("fast",fa),("slow",sl)):
        if idx: print(f"  {name} n={len(idx)}: init+post {st.median([ip[i] for i in idx]):.0f} wait {st.median([w[i] for i in idx]):.0f} done->next {st.median([g[i] for i in idx]):.0f}")
