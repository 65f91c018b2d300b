import glob,sys
rows=[open(f).read().split() for f in sorted(glob.glob("/tmp/xtl.%s.*" % sys.argv[1]))]
n=min(len(r) for r in rows)
out=[]
for k in range(0,n,2):
    ts=[float(r[k].split("/")[0]) for r in rows]; cs=[r[k].split("/")[1] for r in rows]
    out.append("%.1f[%s]" % (max(ts), "".join(cs)))
print(" ".join(out))
