import json,sys,statistics as st
# usage: pool.py LABEL file... : per-turn ours/raw ratio and ours-raw difference, pooled
lab=sys.argv[1]; rat=[];dif=[];ours=[];raw=[]
for f in sys.argv[2:]:
    for rep in json.load(open(f))['reports']:
        t={}
        for x in rep['turns']:
            t.setdefault((x['bytes'],x['turn']),{})[x['series']]=x['time_us']
        for k,v in sorted(t.items()):
            if 'ucc' in v and 'raw-ucc' in v:
                rat.append(v['ucc']/v['raw-ucc']); dif.append(v['ucc']-v['raw-ucc']); ours.append(v['ucc']); raw.append(v['raw-ucc'])
print(f"{lab}: {len(rat)} turns, median ratio {st.median(rat):.3f} ({(st.median(rat)-1)*100:+.1f} %), mean {(st.mean(rat)-1)*100:+.1f} %, within 1.05: {sum(r<=1.05 for r in rat)}, median diff {st.median(dif):+.2f} us, ours med {st.median(ours):.2f} raw med {st.median(raw):.2f}")
