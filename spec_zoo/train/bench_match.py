"""Does the acceptance report predict the benchmark? An artefact's position-1 acceptance per
category in the report, beside the same artefact's on a benchmark run (``report.compare``:
the run's ``results.jsonl`` and per-step ``traces.jsonl``, either may be gzipped, ``.jsonl.gz``, and
which bench method ran which artefact), with how close they are: the mean and largest absolute difference and Spearman's
rank correlation over the categories both have.

The bench's position 1 is counted from its traces: every step that drafted at least one
token reached position 1, and accepted it when it committed two tokens or more.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from spec_zoo.bench.records import beside, read_text
from spec_zoo.errors import ConfigError


def bench_position1(run, method: str) -> dict[str, tuple[int, int]]:
    """(accepted, reached) at position 1 per category of ``method`` in a bench run directory,
    plus ``all`` and, per turn after the first, ``<category> turn <t>``."""
    run = Path(run).expanduser()
    files = [beside(run, name) for name in ("results.jsonl", "traces.jsonl")]
    if not all(f.is_file() for f in files):
        raise ConfigError(f"report.compare.results={str(run)!r} needs results.jsonl and traces.jsonl (a bench run "
                          "with traces=true; or both gzipped, .jsonl.gz).")
    lines = [json.loads(x) for x in read_text(files[0]).splitlines() if x.strip()]
    category = {r["question_id"]: r["category"] for r in lines}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for trace in (json.loads(x) for x in read_text(files[1]).splitlines() if x.strip()):
        if trace["method"] != method:
            continue
        cat = category[trace["question_id"]]
        keys = [cat, "all"] + ([f"{cat} turn {trace['turn']}"] if int(trace.get("turn", 1)) > 1 else [])
        for drafted, committed in zip(trace["steps"]["drafted"], trace["steps"]["committed"]):
            if drafted >= 1:
                for k in keys:
                    counts[k][1] += 1
                    counts[k][0] += committed >= 2
    if not counts:
        raise ConfigError(f"report.compare.methods: no traces of bench method {method!r} in {run}; name a method "
                          "of that run.")
    return {k: (a, r) for k, (a, r) in counts.items()}


def closeness(report: dict[str, float], bench: dict[str, float]) -> dict:
    """Mean and largest |report - bench| and Spearman's rho over the categories in both."""
    from scipy.stats import spearmanr

    common = [c for c in report if c in bench and c != "all"]
    diffs = [abs(report[c] - bench[c]) for c in common]
    rho = float(spearmanr([report[c] for c in common], [bench[c] for c in common]).statistic) if len(common) > 2 \
        else float("nan")
    return {"categories": common, "mean_abs_diff": sum(diffs) / len(diffs) if diffs else float("nan"),
            "max_abs_diff": max(diffs, default=float("nan")), "spearman": rho}
