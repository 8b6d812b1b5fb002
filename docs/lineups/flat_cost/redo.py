"""Drop every (question, turn, repeat) group of which a record was written while other work
ran on the machine (lines 211-295 of results.jsonl: repeats 1-2 measured 07:30-07:53), from
results and traces, so a resumed run measures those groups again, undisturbed."""
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
lines = (d / "results.jsonl").read_text().splitlines()
bad = {(r["question_id"], r["turn"], r["repeat"]) for r in map(json.loads, lines[210:295])}
bad = {k for k in bad if k[2] > 0}
for name in ("results.jsonl", "traces.jsonl"):
    rows = (d / name).read_text().splitlines()
    keep = [l for l in rows if (lambda r: (r["question_id"], r["turn"], r["repeat"]) not in bad)(json.loads(l))]
    (d / name).write_text("".join(l + "\n" for l in keep))
    print(name, len(rows), "->", len(keep))
print(sorted(bad))
