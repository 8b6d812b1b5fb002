"""Coverage, acceptance and draft cost of each draft vocabulary in a vocab run (run.sh):
    python docs/eagle/vocab_equal_steps/coverage.py RUN HEAD...
RUN: the bench dir (results.jsonl, traces.jsonl) with ar_compiled and eagle_v<size>_compiled;
HEAD: the heads' dirs, in the methods' order (8k, 16k, 32k, full). Coverage: the share of the
target's own greedy tokens (ar_compiled's output_ids) that the draft vocabulary holds."""

import collections
import json
import sys
from pathlib import Path

from safetensors import safe_open

run, heads = Path(sys.argv[1]), [Path(h) for h in sys.argv[2:]]
records = [json.loads(line) for line in (run / "results.jsonl").open()]
methods = sorted({r["method"] for r in records if r["method"].startswith("eagle_v")},
                 key=lambda m: [r["method"] for r in records].index(m))
cats = sorted({r["category"] for r in records})
target = [r for r in records if r["method"] == "ar_compiled" and r["repeat"] == 0]


def vocab(head: Path) -> set[int] | None:
    with safe_open(str(head / "eagle.safetensors"), framework="pt") as f:
        return set(f.get_tensor("vocab_ids").tolist()) if "vocab_ids" in f.keys() else None  # noqa: SIM118


def coverage(ids: set[int] | None, rows) -> float:
    tokens = [t for r in rows for t in r["output_ids"]]
    return 1.0 if ids is None else sum(t in ids for t in tokens) / len(tokens)


reached = collections.defaultdict(lambda: [0, 0])  # steps that drafted, accepted position 1
for line in (run / "traces.jsonl").open():
    r = json.loads(line)
    for drafted, committed in zip(r["steps"]["drafted"], r["steps"]["committed"]):
        if drafted:
            reached[r["method"]][0] += 1
            reached[r["method"]][1] += committed >= 2
columns = ["coverage", *(f"coverage {c}" for c in cats), "tau", "pos 1", "draft s per drafted token", "tokens/s"]
print("| method | " + " | ".join(columns) + " |")
print("|---" * (6 + len(cats)) + "|")
for method, head in zip(methods, heads):
    ids, rows = vocab(head), [r for r in records if r["method"] == method]
    by_cat = " | ".join(f"{coverage(ids, [r for r in target if r['category'] == c]):.3f}" for c in cats)
    tokens = sum(r["new_tokens"] for r in rows)
    forwards = sum(r["target_forwards"] for r in rows)
    drafted, draft_s = sum(r["drafted"] for r in rows), sum(r["draft_s"] for r in rows)
    n, a1 = reached[method]
    print(f"| {method} | {coverage(ids, target):.3f} | {by_cat} | {tokens / forwards:.3f} | {a1 / max(n, 1):.3f} | "
          f"{draft_s / max(drafted, 1) * 1e3:.2f} ms | {tokens / sum(r['wall_s'] for r in rows):.1f} |")
