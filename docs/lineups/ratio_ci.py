"""Paired bootstrap CI of method A's pooled speed over method B's, over prompts (question, turn), repeats pooled."""
import json, random, sys, collections
path, pairs = sys.argv[1], [p.split("/") for p in sys.argv[2:]]
rs = [json.loads(l) for l in open(path)]
by = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
for r in rs:
    k = (r["question_id"], r["turn"])
    by[r["method"]][k][0] += r["new_tokens"]; by[r["method"]][k][1] += r["wall_s"]
rng = random.Random(0)
for a, b in pairs:
    keys = sorted(set(by[a]) & set(by[b]))
    def ratio(ks):
        ta = sum(by[a][k][0] for k in ks); sa = sum(by[a][k][1] for k in ks)
        tb = sum(by[b][k][0] for k in ks); sb = sum(by[b][k][1] for k in ks)
        return (ta / sa) / (tb / sb)
    boots = sorted(ratio([rng.choice(keys) for _ in keys]) for _ in range(2000))
    print(f"{a} / {b}: {ratio(keys):.3f}x [{boots[50]:.3f}, {boots[1949]:.3f}] over {len(keys)} prompts")
