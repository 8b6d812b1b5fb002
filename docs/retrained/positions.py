"""Acceptance by draft position *given the positions before it were accepted*, per
Spec-Bench category, from a benchmark's traces (`spec-zoo-bench ... traces=true`).

The report's "acceptance by position" is the share of drafts reaching position j that
accepted it; issue 13's goals are conditional ("the second given the first"), which the
per-step traces give exactly: a step that drafted d tokens and committed c (accepted
c - 1) reached position j given 1..j-1 accepted when d >= j and c - 1 >= j - 1.

    python docs/retrained/positions.py docs/retrained   # results.jsonl + traces.jsonl there (or .jsonl.gz)
"""

import collections
import gzip
import json
import sys
from pathlib import Path

CATEGORIES = ["all", "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def lines(run: Path, name: str) -> list[str]:
    """The lines of ``name`` in ``run``, or of ``name``.gz (the runs kept in docs/ are gzipped)."""
    path = run / name
    text = path.read_text() if path.is_file() else gzip.decompress((run / f"{name}.gz").read_bytes()).decode()
    return text.splitlines()


def conditional(run: Path) -> dict:
    results = map(json.loads, lines(run, "results.jsonl"))
    category = {r["question_id"]: r["category"] for r in results}
    # method -> (cat, j) -> [accepted, reached]
    counts = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
    for trace in map(json.loads, lines(run, "traces.jsonl")):
        steps = trace["steps"]
        for drafted, committed in zip(steps["drafted"], steps["committed"]):
            for j in range(1, drafted + 1):
                if committed - 1 >= j - 1:
                    for key in ((category[trace["question_id"]], j), ("all", j)):
                        counts[trace["method"]][key][1] += 1
                        counts[trace["method"]][key][0] += committed - 1 >= j
    return counts


def main() -> None:
    counts = conditional(Path(sys.argv[1]))
    print("| method | position | " + " | ".join(CATEGORIES) + " |")
    print("|---|---|" + "---|" * len(CATEGORIES))
    for method, cells in counts.items():
        for j in (1, 2, 3):
            row = [f"{cells[(c, j)][0] / cells[(c, j)][1]:.2f} ({cells[(c, j)][1]})" if cells[(c, j)][1] else "-"
                   for c in CATEGORIES]
            if any(r != "-" for r in row):
                print(f"| {method} | {j} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
