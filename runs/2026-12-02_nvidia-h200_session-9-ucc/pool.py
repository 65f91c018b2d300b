import json,sys,statistics as st
# usage: pool.py LABEL file... : per size, every turn's ours/raw ratio and ours-raw difference, pooled over the files
# (ucc12e's pool.py, split by size)
lab=sys.argv[1]; by={}
for f in sys.argv[2:]:
    for rep in json.load(open(f))['reports']:
        t={}
        for x in rep['turns']:
            t.setdefault((x['bytes'],x['turn']),{})[x['series']]=x['time_us']
        for (b,_),v in sorted(t.items()):
            if 'ucc' in v and 'raw-ucc' in v:
                by.setdefault(b,[]).append((v['ucc'],v['raw-ucc']))
for b,p in sorted(by.items()):
    rat=[o/r for o,r in p]; dif=[o-r for o,r in p]
    print(f"{lab} {b} B: {len(p)} turns, median ratio {st.median(rat):.3f} ({(st.median(rat)-1)*100:+.1f} %), mean {(st.mean(rat)-1)*100:+.1f} %, within 1.05: {sum(r<=1.05 for r in rat)}, median diff {st.median(dif):+.2f} us, ours med {st.median([o for o,_ in p]):.2f} raw med {st.median([r for _,r in p]):.2f}")
