# The N fastest records (by median) of every task of a dataset, the latest record of each
# schedule: the input of bench/noise_ceiling.py. Usage: topn.py DATASET OUT.jsonl N
import json,sys,gzip
src,dst,n=sys.argv[1],sys.argv[2],int(sys.argv[3])
op=gzip.open if src.endswith('.gz') else open
latest={}
with op(src,'rt') as f:
    for line in f:
        if not line.strip(): continue
        r=json.loads(line)
        key=(r['workload'],r['target'],json.dumps(r['fingerprint'],sort_keys=True),json.dumps(r['trace'],sort_keys=True),json.dumps(r.get('mapping'),sort_keys=True))
        latest[key]=(line,r)
by={}
for line,r in latest.values():
    if 'Ok' not in r['result']: continue
    by.setdefault(r['workload'],[]).append((r['result']['Ok']['timing']['median_s'],line))
with open(dst,'w') as out:
    c=0
    for w,v in by.items():
        v.sort(key=lambda x:x[0])
        for _,line in v[:n]:
            out.write(line if line.endswith('\n') else line+'\n'); c+=1
print(c,'records of',len(by),'tasks')
