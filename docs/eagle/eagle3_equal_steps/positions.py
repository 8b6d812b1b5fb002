"""Per-position acceptance of the run's chains from its traces (docs/eagle.md): position 1,
position 2 given 1, position 3 given 2, and position 1 by category.
    python docs/eagle/eagle3_equal_steps/positions.py DIR   # run.sh OUT/bench (records not kept in docs/)"""

import collections
import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
category = {}
for line in (run / "results.jsonl").open():
    r = json.loads(line)
    category[(r["method"], r["question_id"], r["turn"], r["repeat"])] = r["category"]
reached = collections.defaultdict(lambda: [0, 0, 0, 0])  # steps that drafted, accepted >= 1, >= 2, >= 3
for line in (run / "traces.jsonl").open():
    r = json.loads(line)
    if not any(r["steps"]["drafted"]):
        continue
    cat = category[(r["method"], r["question_id"], r["turn"], r["repeat"])]
    for drafted, committed in zip(r["steps"]["drafted"], r["steps"]["committed"]):
        if drafted:
            for key in (r["method"], (r["method"], cat)):
                counts = reached[key]
                counts[0] += 1
                for j in (1, 2, 3):
                    counts[j] += committed - 1 >= j
cats = sorted({c for c in category.values()})
print("| method | steps | pos 1 | pos 2 given 1 | pos 3 given 2 | " + " | ".join(f"pos 1 {c}" for c in cats) + " |")
print("|---" * (5 + len(cats)) + "|")
for m in sorted(k for k in reached if isinstance(k, str)):
    n, a1, a2, a3 = reached[m]
    by_cat = " | ".join(f"{reached[(m, c)][1] / reached[(m, c)][0]:.2f}" for c in cats)
    print(f"| {m} | {n} | {a1 / n:.3f} | {a2 / max(a1, 1):.3f} | {a3 / max(a2, 1):.3f} | {by_cat} |")
