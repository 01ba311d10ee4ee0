# Top-1 under measurement noise: records measured twice (a dataset's top-N per task, then
# `remeasure --all --out`), each task ranked by one measurement and scored by the other.
import sys
import json,collections
def load(p):
    d={}
    for line in open(p):
        r=json.loads(line)
        if 'Ok' not in r['result']: continue
        d[(r['workload'],json.dumps(r['trace'],sort_keys=True))]=r['result']['Ok']['timing']
    return d
a=load(sys.argv[1]); b=load(sys.argv[2])
tasks=collections.defaultdict(list)
for k,t in b.items():
    if k in a: tasks[k[0]].append((a[k],t))
for stat in ['median_s','min_s']:
    bs=cs=0; bs2=cs2=0; ratios=[]
    for w,v in tasks.items():
        first=[x[0][stat] for x in v]; second=[x[1][stat] for x in v]
        best=min(first); pick=first[second.index(min(second))]
        bs+=best; cs+=pick; ratios.append(best/pick)
        # symmetric: rank by first, judge by second
        best2=min(second); pick2=second[first.index(min(first))]
        bs2+=best2; cs2+=pick2
    print(stat,len(tasks),'tasks: rank by 2nd, judge by 1st: weighted %.3f mean %.3f | rank by 1st judge by 2nd: weighted %.3f'%(bs/cs,sum(ratios)/len(ratios),bs2/cs2))
# per-record ratio distribution
import math
lr=[math.log(t2['median_s']/t1['median_s']) for v in tasks.values() for t1,t2 in v]
lr.sort(); n=len(lr)
print('new/old median ratio: p10 %.3f p50 %.3f p90 %.3f'%(math.exp(lr[n//10]),math.exp(lr[n//2]),math.exp(lr[9*n//10])))
