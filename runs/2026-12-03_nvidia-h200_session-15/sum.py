# sum.py DIR LABELS...: a table of ours (µs) and x (Open MPI / ours) per size
# from DIR/summary.txt, rounds side by side.
import sys,collections
dr=sys.argv[1]; labs=sys.argv[2:]
d=collections.defaultdict(list); cur=None
for l in open(dr+'/summary.txt'):
    if l.startswith('=='):
        p=l.split(); cur=(p[1],p[2])
    elif l.strip():
        sz,us,x=l.split(); d[(cur,sz)].append((float(us),float(x.lstrip('x'))))
sizes=['8','4096','65536','262144','1048576','4194304','16777216','67108864']
for np_ in ['np2','np4']:
    ls=[l for l in labs if d.get(((l,np_),'8'))]
    if not ls: continue
    print('|', np_, '|', ' | '.join(ls), '|'); print('|---'*(len(ls)+1)+'|')
    for s in sizes:
        print(f'| {s} |', ' | '.join(', '.join(f'{u:.1f} (x{x:.2f})' for u,x in d.get(((l,np_),s),[])) for l in ls), '|')
