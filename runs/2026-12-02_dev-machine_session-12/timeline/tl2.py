import sys, statistics as st
ghz=float(sys.argv[1])
for f in sys.argv[2:]:
    x=[tuple(map(int,l.split())) for l in open(f)][1000:]
    ip=[(p-e)/ghz for e,p,d in x]; w=[(d-p)/ghz for e,p,d in x]
    g=[(x[i+1][0]-x[i][2])/ghz for i in range(len(x)-1)]; cy=[(x[i+1][0]-x[i][0])/ghz for i in range(len(x)-1)]
    q=lambda v,p: sorted(v)[int(p*len(v))]
    print(f"{f}: cycle med {st.median(cy):5.0f} mean {st.mean(cy):5.0f} | init+post {st.median(ip):4.0f} | wait med {st.median(w):4.0f} mean {st.mean(w):5.0f} | done->next med {st.median(g):4.0f} p25 {q(g,.25):4.0f} p75 {q(g,.75):4.0f} mean {st.mean(g):5.0f}")
