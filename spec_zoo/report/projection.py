"""What-if projection (``spec-zoo-project``): a benchmark's per-step traces (``traces=true``)
replayed under another scoring-cost table t(M) (measured on another machine, or a stated
roofline), with the tree and draft length the cost model would pick there.

The cost model is the one ``tree=auto`` plans with (`spec_zoo.trees.best_tree`: expected
tokens per step from the acceptance per sibling rank, over one draft forward per level plus
t(M)/t(1)); a chain is its one-child-per-node case, which is the adaptive draft length's
rule (`spec_zoo.draft_length`). Everything is in seconds of the traced run, with u the
seconds of one plain decoding step there (the mean verify time of ``ar``'s steps after its
first); per record:

- replay: the run's own drafts, re-priced. The first step (the prefill), the drafting and
  the loop's own work are kept as measured; step i > 0 scores ``drafted_i + 1`` tokens for
  u t(M)/t(1).
- pick: the fastest tree (or chain) under the table, given the run's acceptance per rank
  and its measured draft seconds per level (in u): its predicted speed s, tokens per u,
  replaces the drafting and scoring of the steps after the first.

Speedups are pooled over the prompts a method shares with ``ar``, as the summary's are.
Under the machine's own table the replay predicts the measured speedup (docs/trees.md
reports the error); under another it is a projection, and is printed as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spec_zoo.bench.records import BASELINE, TRACE_FILE, beside, read_traces, record_key
from spec_zoo.bench.summary import prompt_key
from spec_zoo.costs import CostTable
from spec_zoo.errors import ConfigError
from spec_zoo.report.build import labeller, load_results
from spec_zoo.trees import RankAcceptance, Relative, best_tree


def load_table(path) -> CostTable:
    """The cost table at ``path`` (`CostTable` JSON), refused in one line when it is not one."""
    return CostTable.load(Path(path), "--costs", "give a table `spec-zoo costs` wrote, or docs/trees/roofline_gpu.json")


def traced_records(paths: Sequence) -> list[dict]:
    """The records under ``paths`` that have a trace (in ``_steps``); an error naming the fix
    when ``ar`` or every other method has none."""
    records = load_results(paths)
    sources = {r["_source"] for r in records}
    traces = {source: read_traces(beside(Path(source).parent, TRACE_FILE)) for source in sources}
    traced = [{**r, "_steps": traces[r["_source"]][record_key(r)]} for r in records
              if record_key(r) in traces[r["_source"]]]
    if not {BASELINE} < {r["method"] for r in traced}:
        raise ConfigError(f"paths: the records under {', '.join(map(str, paths))} have no per-step traces of `ar` "
                          f"and another method ({TRACE_FILE}); rerun spec-zoo-bench with traces=true into a new "
                          "out= directory and project that.")
    return traced


def replay_seconds(record: dict, unit: float, relative: Relative) -> float:
    """The record's time with the scoring of every step after the first priced by the table."""
    steps = record["_steps"]
    return record["wall_s"] - sum(steps["verify_s"][1:]) + unit * sum(relative(n + 1) for n in steps["drafted"][1:])


def pick_seconds(record: dict, unit: float, speed: float) -> float:
    """The record's time had every step after the first run at ``speed`` tokens per ``unit``."""
    steps = record["_steps"]
    kept = record["wall_s"] - sum(steps["verify_s"][1:]) - sum(steps["draft_s"][1:])
    return kept + unit * sum(steps["committed"][1:]) / speed


@dataclass
class Pick:
    """A tree (static paths of child ranks; a chain when every rank is 0) and its predicted speedup."""

    paths: list[tuple[int, ...]]
    speed: float  # tokens per plain decoding step, steady state (the cost model's)
    speedup: float  # over ar, with the first step and the loop's own work as measured

    def describe(self) -> str:
        if not self.paths:
            return "no draft"
        depth = max(map(len, self.paths))
        if all(r == 0 for p in self.paths for r in p):
            return f"chain of {depth}"
        width = max(p[-1] for p in self.paths) + 1
        return f"{len(self.paths)} nodes, depth {depth}, width {width}"


@dataclass
class Projection:
    """One method's replay under a table and what the cost model would pick there."""

    method: str
    records: int
    tau: float
    nodes: float  # drafted nodes per step, as run
    measured: float  # speedup over ar measured in the run
    priced: float  # share of the method's measured time that the table re-prices (scoring after the first step)
    replay: float  # the run's drafts under the table
    acceptance: list[float]  # acc[r] per sibling rank
    evidence: list[float]  # reached nodes that had a rank-r child (0: acc[r] is the prior)
    draft_cost: float  # seconds of one draft forward (a level), in plain decoding steps
    chain: Pick
    tree: Pick


def project(records: Sequence[dict], table: CostTable, max_nodes: int = 64, max_depth: int = 8,
            max_width: int = 4) -> list[Projection]:
    """Per method (a row as the report labels it), the replay and the picks under ``table``
    for traced ``records`` (`traced_records`). A pick scores at most as many tokens as the
    table holds: past it, `CostTable.relative` extrapolates the last step, which a noisy
    table may slope downwards."""
    relative, max_nodes = table.relative, min(max_nodes, len(table.seconds) - 1)
    base = {prompt_key(r): r for r in records if r["method"] == BASELINE}
    unit = {}
    for source in {r["_source"] for r in base.values()}:
        verify = [s for r in base.values() if r["_source"] == source for s in r["_steps"]["verify_s"][1:]]
        unit[source] = sum(verify) / len(verify) if verify else None
    rows: dict[str, list[dict]] = {}
    label = labeller(records)
    for r in records:
        if r["method"] != BASELINE and unit.get(r["_source"]) and prompt_key(r) in base:
            rows.setdefault(label(r), []).append(r)
    return [_project(name, rs, base, unit, relative, max_nodes, max_depth, max_width) for name, rs in rows.items()]


def _project(name, records, base, unit, relative, max_nodes, max_depth, max_width) -> Projection:
    stats = RankAcceptance(max_width, decay=1.0)
    draft_units = levels = 0.0
    for r in records:
        steps = r["_steps"]
        for widths, ranks in zip(steps["widths"], steps["ranks"]):
            stats.observe(widths, ranks)
        draft_units += sum(steps["draft_s"][1:]) / unit[r["_source"]]
        levels += sum(steps["depth"][1:])
    acc, draft_cost = stats.rates(), draft_units / max(levels, 1)
    baselines = [base[prompt_key(r)] for r in records]

    def replayed(r):
        return replay_seconds(r, unit[r["_source"]], relative)

    def speedup(seconds, base_seconds=replayed) -> float:
        """Pooled tokens per second of the method over ar's, timed by ``seconds(record)``."""
        mine = sum(r["new_tokens"] for r in records) / sum(map(seconds, records))
        return mine / (sum(b["new_tokens"] for b in baselines) / sum(map(base_seconds, baselines)))

    def pick(width: int, nodes: int) -> Pick:
        paths, tokens, cost = best_tree(acc, relative, draft_cost, nodes, max_depth, width)
        speed = tokens / cost
        return Pick(paths, speed, speedup(lambda r: pick_seconds(r, unit[r["_source"]], speed)))

    forwards = sum(len(r["_steps"]["drafted"]) for r in records)
    return Projection(
        name, len(records), sum(r["new_tokens"] for r in records) / forwards,
        sum(sum(r["_steps"]["drafted"]) for r in records) / forwards,
        speedup(_wall, _wall), sum(sum(r["_steps"]["verify_s"][1:]) for r in records) / sum(map(_wall, records)),
        speedup(replayed), acc, stats.tried, draft_cost,
        pick(1, min(max_depth, max_nodes)), pick(max_width, max_nodes))


def _wall(record: dict) -> float:
    return record["wall_s"]


def format_projection(rows: Sequence[Projection], table: CostTable, table_path, sources: Sequence) -> str:
    """The projection as markdown, labelled as one."""
    marks = [m for m in (1, 2, 4, 8, 16, 32, 64, 128) if m <= max(len(table.seconds), 16)]
    curve = ", ".join(f"{m}: {table.relative(m):.2f}" for m in marks)
    lines = [
        f"PROJECTION (cost model, not a measurement): traces of {', '.join(map(str, sources))} replayed under the "
        f"cost table {table_path} ({table.model}, runtime {table.runtime}, {table.dtype}, machine {table.machine}); "
        f"t(M)/t(1) at M = {curve}.",
        "",
        "measured: speedup over ar in the traced run. priced by the table: the share of its measured time the table "
        "re-prices (scoring after the first step). replay: the run's own drafts, their scoring priced by the table. "
        "best chain / tree: what the cost model picks under the table from the run's acceptance per sibling rank "
        "(in parentheses: a rank never drafted, its prior) and draft cost per level (in plain steps, measured in the "
        "run). The first step (prefill) and the loop's own work stay as measured.",
        "",
        "| method | records | as run: tau, nodes/step | measured | priced by the table | replay | replay vs measured "
        "| acceptance by rank | draft cost | best chain | best tree |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in rows:
        acc = "/".join(f"{a:.2f}" if n else f"({a:.2f})" for a, n in zip(p.acceptance, p.evidence))
        lines.append(
            f"| {p.method} | {p.records} | {p.tau:.2f}, {p.nodes:.1f} | {p.measured:.2f}x | {p.priced:.0%} | "
            f"{p.replay:.2f}x | "
            f"{(p.replay / p.measured - 1) * 100:+.0f}% | {acc} | {p.draft_cost:.2f} | "
            f"{p.chain.describe()}: {p.chain.speedup:.2f}x | {p.tree.describe()}: {p.tree.speedup:.2f}x |")
    return "\n".join(lines) + "\n"
