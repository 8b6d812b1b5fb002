"""``spec-zoo-bench --dry-run`` (or ``dry_run=true``): the grid a run would measure, what a
rerun would skip, and an estimated duration, printed before any model loads.

The estimate uses, per method, the seconds per token of records already in the results
file (any configuration of that method: the best guess available), else
``plan_tokens_per_s`` (a rough throughput of the target alone) divided by nothing: a
method never measured is assumed to run at the baseline's speed.
"""

from __future__ import annotations

from collections.abc import Sequence

from spec_zoo.bench.dataset import Question
from spec_zoo.bench.records import BASELINE
from spec_zoo.bench.specs import MethodSpec


def plan_text(specs: Sequence[MethodSpec], hashes: Sequence[str], questions: Sequence[Question], repeats: int,
              max_new_tokens: int, existing: Sequence[dict], tokens_per_s: float, results_path) -> str:
    turns = sum(len(q.turns) for q in questions)
    done_keys = {(r["method"], r["question_id"], r["turn"], r["repeat"], r["config_hash"]) for r in existing}
    categories = sorted({q.category for q in questions})
    seconds_per_token: dict[str, list[float]] = {}
    for r in existing:
        if r.get("new_tokens"):
            seconds_per_token.setdefault(r["method"], []).append(r["wall_s"] / r["new_tokens"])
    base = seconds_per_token.get(BASELINE)
    default = sum(base) / len(base) if base else 1.0 / tokens_per_s
    lines = [f"plan: {len(questions)} prompts ({turns} turns) in {len(categories)} categories "
             f"({', '.join(categories)}) x {repeats} repeat(s) x {len(specs)} methods, "
             f"up to {max_new_tokens} new tokens each; results: {results_path}",
             "", "| method | drafter | params | generations | done | to run | est. s/token | est. time |",
             "|---|---|---|---|---|---|---|---|"]
    total_s, total_todo = 0.0, 0
    for spec, h in zip(specs, hashes):
        runs = [(q.question_id, t, r) for q in questions for r in range(repeats) for t in range(1, len(q.turns) + 1)]
        done = sum((spec.name, q, t, r, h) in done_keys for q, t, r in runs)
        todo = len(runs) - done
        measured = seconds_per_token.get(spec.name)
        spt = sum(measured) / len(measured) if measured else default
        seconds = todo * max_new_tokens * spt
        total_s += seconds
        total_todo += todo
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items()) or "-"
        lines.append(f"| {spec.name} | {spec.drafter_label} | {params} | {len(runs)} | {done} | {todo} | "
                     f"{spt:.4f}{'' if measured else ' (guess)'} | {_duration(seconds)} |")
    lines += ["", f"to run: {total_todo} generations, estimated {_duration(total_s)} "
              f"(+ model loading and a warm-up per method); nothing was run (dry run)."]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
