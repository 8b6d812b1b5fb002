"""Issue 22's behaviour check: two bench runs of the same methods and questions (before and
after a refactor) must give the same output ids, record for record, and traces with the same
columns. Usage: python docs/refactor/compare.py BEFORE_DIR AFTER_DIR"""

import json
import sys
from pathlib import Path


def rows(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[(r["method"], r["question_id"], r["turn"], r["repeat"])] = r
    return out


before, after = (Path(d) for d in sys.argv[1:3])
a, b = rows(before / "results.jsonl"), rows(after / "results.jsonl")
ta, tb = rows(before / "traces.jsonl"), rows(after / "traces.jsonl")
same = [k for k in a if k in b and a[k]["output_ids"] == b[k]["output_ids"]]
differ = [k for k in a if k in b and a[k]["output_ids"] != b[k]["output_ids"]]
columns = {k: (sorted(ta[k]["steps"]), sorted(tb[k]["steps"])) for k in ta if k in tb}
print(f"records: {len(a)} before, {len(b)} after; equal outputs {len(same)}, different {len(differ)}")
for k in differ:
    print("  differs:", k)
bad = {k: c for k, c in columns.items() if c[0] != c[1]}
first = next(iter(columns.values()))[0] if columns else None
print(f"traces: {len(columns)} compared, same columns in {len(columns) - len(bad)}; columns {first}")
sys.exit(1 if differ or bad or len(a) != len(b) else 0)
