"""Per method x category summary of a results file, Spec-Bench style.

speedup:    (sum new_tokens / sum wall_s) of the method over the same of the baseline ``ar``
            on the same prompts (question, turn, repeat): pooled, not a mean of per-prompt
            ratios, so long answers weigh as much as they cost.
own speedup: the same over the record's own plain method (its ``plain`` field: a peer engine's
            plain decoding, ``ar_compiled`` for a compiled method), shown when some method's
            own plain is not the baseline.
Spec-Bench speedup: Spec-Bench's own formula (mean over questions of each question's summed
            tokens / summed seconds, method over baseline; mean over repeats).
tau:        sum new_tokens / sum target_forwards (tokens committed per target forward).
alpha:      sum accepted / sum drafted.
match rate: share of comparable records whose output equals the baseline's (Spec-Bench's
            `equal` check); mismatches carry the target's top-2 logit margin, so a near-tie
            (margin < NEAR_TIE) is told apart from a broken method.
speedup CI: paired prompt-level bootstrap 95% interval, and the median over repeats
            (`spec_zoo.bench.stats`).
predicted:  what the method itself predicted when its records say (``predicted_speedup``:
            tree=auto's cost model, pooled as tokens over predicted time); else the classic
            cost model (Leviathan et al.): tau * t_ar / (t_draft + t_ar), with t_draft the
            measured draft seconds per target forward and t_ar the paired baseline's seconds
            per token, i.e. assuming a verify forward costs one plain decoding step.
            Measured below predicted = what scoring several tokens per forward (and the
            loop's own work) really costs. prediction error: predicted / measured - 1.
"overall" pools every category. Pure functions of the records: usable on any results file,
or on records merged from several (each record's ``_source`` keeps its baseline pairing
within its own file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from spec_zoo.bench.dataset import CATEGORIES
from spec_zoo.bench.records import (
    BASELINE,
    FAILURE_FILE,
    beside,
    check_schema,
    failure_warnings,
    method_label,
    read_records,
    unique_records,
)
from spec_zoo.bench.stats import Pair, SpeedupStats, specbench_speedup, speedup_stats

OVERALL = "overall"
#: a greedy mismatch whose top-1 minus top-2 logit is below this is explained as a near-tie
NEAR_TIE = 0.5


@dataclass
class Cell:
    """Pooled counts of the records of one method in one category."""

    records: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    counted_tokens: int = 0  # new_tokens of the records that report target_forwards
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    compared: int = 0  # records with matches_baseline not null
    matches: int = 0
    paired_tokens: int = 0  # the records with a baseline record for the same prompt ...
    paired_wall_s: float = 0.0
    base_tokens: int = 0  # ... and those baseline records
    base_wall_s: float = 0.0
    plain_pair_tokens: int = 0  # the records with a record of their own plain method (`plain`) ...
    plain_pair_wall_s: float = 0.0
    plain_tokens: int = 0  # ... and those plain records
    plain_wall_s: float = 0.0
    timed_forwards: int = 0  # target_forwards of the records reporting draft_s / verify_s
    draft_s: float = 0.0
    verify_s: float = 0.0
    own_predicted: int = 0  # records carrying the method's own predicted_speedup ...
    own_tokens: int = 0  # ... their new tokens, and those over the predicted speedup
    own_time: float = 0.0
    pairs: list = field(default_factory=list)  # stats.Pair per paired record (for the bootstrap)
    position_sums: list = field(default_factory=list)  # sum over records of accept_per_position[j]
    position_counts: list = field(default_factory=list)
    mismatch_margins: list = field(default_factory=list)  # top2_margin_at_mismatch (None: output ran short)
    seed: int = 0  # of the bootstrap

    def add(self, r: dict, base: dict | None, plain: dict | None = None) -> None:
        """Count record ``r``; ``base`` is the baseline's record for the same prompt, if any;
        ``plain`` that of its own plain method (`spec_zoo.bench.specs.with_plains`)."""
        self.records += 1
        if plain is not None:
            self.plain_pair_tokens += r["new_tokens"]
            self.plain_pair_wall_s += r["wall_s"]
            self.plain_tokens += plain["new_tokens"]
            self.plain_wall_s += plain["wall_s"]
        if base is not None:
            self.paired_tokens += r["new_tokens"]
            self.paired_wall_s += r["wall_s"]
            self.base_tokens += base["new_tokens"]
            self.base_wall_s += base["wall_s"]
            self.pairs.append(Pair((r.get("_source"), r["question_id"], r["turn"]), r["repeat"], r["new_tokens"],
                                   r["wall_s"], base["new_tokens"], base["wall_s"]))
        self.new_tokens += r["new_tokens"]
        self.wall_s += r["wall_s"]
        if r.get("target_forwards") is not None:
            self.counted_tokens += r["new_tokens"]
            self.target_forwards += r["target_forwards"]
            if r.get("draft_s") is not None and r.get("verify_s") is not None:
                self.timed_forwards += r["target_forwards"]
                self.draft_s += r["draft_s"]
                self.verify_s += r["verify_s"]
        if r.get("predicted_speedup"):
            self.own_predicted += 1
            self.own_tokens += r["new_tokens"]
            self.own_time += r["new_tokens"] / r["predicted_speedup"]
        for j, rate in enumerate(r.get("accept_per_position") or []):
            if j == len(self.position_sums):
                self.position_sums.append(0.0)
                self.position_counts.append(0)
            self.position_sums[j] += rate
            self.position_counts[j] += 1
        if r.get("matches_baseline") is False:
            self.mismatch_margins.append(r.get("top2_margin_at_mismatch"))
        self.drafted += r.get("drafted") or 0
        self.accepted += r.get("accepted") or 0
        if r.get("matches_baseline") is not None:
            self.compared += 1
            self.matches += bool(r["matches_baseline"])

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def speedup(self) -> float | None:
        """Throughput over the baseline's, on the prompts both ran."""
        if not (self.paired_wall_s and self.base_tokens and self.base_wall_s):
            return None
        return (self.paired_tokens / self.paired_wall_s) / (self.base_tokens / self.base_wall_s)

    @property
    def own_speedup(self) -> float | None:
        """Throughput over that of its own plain method (a peer engine's plain decoding, ``ar_compiled``
        for a compiled method), on the prompts both ran."""
        if not (self.plain_pair_wall_s and self.plain_tokens and self.plain_wall_s):
            return None
        return (self.plain_pair_tokens / self.plain_pair_wall_s) / (self.plain_tokens / self.plain_wall_s)

    @property
    def tau(self) -> float | None:
        return self.counted_tokens / self.target_forwards if self.target_forwards else None

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def match_rate(self) -> float | None:
        return self.matches / self.compared if self.compared else None

    @cached_property
    def speedup_stats(self) -> SpeedupStats:
        """Pooled speedup, median over repeats and bootstrap 95% CI (`spec_zoo.bench.stats`)."""
        return speedup_stats(self.pairs, seed=self.seed)

    @property
    def specbench_speedup(self) -> float | None:
        """Spec-Bench's formula: mean per-question throughput over the baseline's (`stats.specbench_speedup`)."""
        return specbench_speedup(self.pairs)

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        return self.speedup_stats.ci

    @property
    def speedup_median(self) -> float | None:
        return self.speedup_stats.median

    @property
    def predicted_speedup(self) -> float | None:
        """What every record's method predicted itself (tree=auto), pooled as tokens over
        predicted time; else the classic model: tau * t_ar / (t_draft + t_ar), t_draft = draft
        seconds per target forward, t_ar = the baseline's seconds per token (a verify forward
        assumed to cost one plain step)."""
        if self.own_predicted == self.records and self.own_time:
            return self.own_tokens / self.own_time
        if not (self.timed_forwards and self.base_tokens and self.base_wall_s and self.tau):
            return None
        t_ar = self.base_wall_s / self.base_tokens
        return self.tau * t_ar / (self.draft_s / self.timed_forwards + t_ar)

    @property
    def prediction_error(self) -> float | None:
        """Predicted over measured speedup, minus 1 (+0.10: predicted 10% too fast)."""
        predicted, measured = self.predicted_speedup, self.speedup
        return predicted / measured - 1 if predicted is not None and measured else None

    @property
    def accept_per_position(self) -> list[float]:
        """Mean over records of each position's acceptance rate (records whose drafts reached it)."""
        return [s / c for s, c in zip(self.position_sums, self.position_counts)]

    @property
    def mismatches(self) -> int:
        return self.compared - self.matches

    @property
    def near_ties(self) -> int:
        """Mismatches explained by a near-tie of the target (top-2 margin < NEAR_TIE)."""
        return sum(m is not None and m < NEAR_TIE for m in self.mismatch_margins)

    @property
    def equality(self) -> str | None:
        """Spec-Bench's `equal` check in words: 'matches/compared', plus the near-tie explanation."""
        if not self.compared:
            return None
        text = f"{self.matches}/{self.compared}"
        if self.mismatches:
            largest = max((m for m in self.mismatch_margins if m is not None), default=None)
            text += f" ({self.near_ties} of {self.mismatches} near-ties"
            text += f", max margin {largest:.3g})" if largest is not None else ")"
        return text


@dataclass
class Summary:
    methods: list[str]  # in first-seen order (the run order: baseline first)
    categories: list[str]  # report order, OVERALL last
    cells: dict[tuple[str, str], Cell]
    baseline: str = BASELINE
    warnings: tuple[str, ...] = ()
    own_plains: dict[str, str] = field(default_factory=dict)  # method -> its own plain, where not the baseline

    def get(self, method: str, category: str, stat: str):
        """One statistic (a `Cell` property, e.g. "speedup") of a method in a category; None if absent."""
        cell = self.cells.get((method, category))
        return getattr(cell, stat) if cell else None

    def to_markdown(self) -> str:
        tables = [
            (f"Speedup over `{self.baseline}` (summed tokens / summed seconds, same prompts)", "speedup", "{:.2f}x"),
            ("Tokens per second", "tokens_per_s", "{:.1f}"),
            ("tau (tokens per target forward)", "tau", "{:.2f}"),
            ("alpha (accepted / drafted)", "alpha", "{:.3f}"),
            (f"Match rate vs `{self.baseline}`", "match_rate", "{:.0%}"),
        ]
        extra = [
            ("Spec-Bench speedup (mean over questions of per-question tokens/s, over the baseline's)",
             "specbench_speedup", "{:.2f}x"),
            ("Speedup 95% CI (paired bootstrap over prompts)", "speedup_ci", "[{0:.2f}, {1:.2f}]"),
            ("Speedup, median over repeats", "speedup_median", "{:.2f}x"),
            (f"Output equal to `{self.baseline}` (Spec-Bench `equal`; near-tie: top-2 logit margin < {NEAR_TIE})",
             "equality", "{}"),
            ("Predicted speedup (tree=auto: its own cost model; others: tau x t_ar / (t_draft + t_ar), "
             "verify = one plain step)", "predicted_speedup", "{:.2f}x"),
            ("Prediction error (predicted / measured speedup - 1)", "prediction_error", "{:+.0%}"),
        ]
        if self.own_plains:  # some method's own plain decoding is not the baseline (a peer engine, a runtime)
            tables.insert(1, ("Speedup over its own plain decoding (same engine, runtime and dtype: "
                              + ", ".join(f"{m} over {p}" for m, p in self.own_plains.items()) + ")",
                              "own_speedup", "{:.2f}x"))
            tables[-1] = ("Match rate vs its own plain decoding (the baseline unless named above)", "match_rate",
                          "{:.0%}")
        lines = ["# Benchmark summary", ""]
        lines += [f"> warning: {w}" for w in self.warnings]
        for title, stat, fmt in tables + extra:
            lines += self.table(title, stat, fmt)
        counts = ", ".join(f"{m}: {self.cells[(m, OVERALL)].records}" for m in self.methods)
        lines.append(f"Records per method: {counts}. "
                     "`-`: not measured or not defined (e.g. tau of a transformers reference).")
        return "\n".join(lines) + "\n"

    def table(self, title: str, stat: str, fmt: str, level: str = "##") -> list[str]:
        """Markdown lines of one method x category table of ``stat``."""
        lines = [f"{level} {title}", "", "| method | " + " | ".join(self.categories) + " |",
                 "|---" * (len(self.categories) + 1) + "|"]
        for m in self.methods:
            cells = []
            for c in self.categories:
                v = self.get(m, c, stat)
                cells.append("-" if v is None else fmt.format(*v) if isinstance(v, tuple) else fmt.format(v))
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        return lines + [""]


def prompt_key(r: dict) -> tuple:
    """What pairs a record with its baseline: the same file (``_source``, set when merging
    several), the same run settings, the same prompt and repeat."""
    return (r.get("_source"), r.get("model"), r.get("dataset"), r.get("temperature"), r.get("max_new_tokens"),
            r["question_id"], r["turn"], r["repeat"])


def summarize(records: Iterable[dict], baseline: str = BASELINE, label: Callable[[dict], str] | None = None,
              seed: int = 0) -> Summary:
    """Pool records per (method, category) and overall. ``label(record)`` names a record's
    row (default: its method; a report merging sweeps adds the settings that differ).
    ``seed`` seeds the bootstrap."""
    records = list(records)
    label = label or method_label
    baseline_of = {prompt_key(r): r for r in records if r["method"] == baseline}
    by_method = {(prompt_key(r), r["method"]): r for r in records}
    own_plains = {label(r): r["plain"] for r in records if r.get("plain", baseline) != baseline}
    cells: dict[tuple[str, str], Cell] = {}
    methods: dict[str, set] = {}
    seen_categories = set()
    for r in records:
        name = label(r)
        methods.setdefault(name, set()).add((r.get("_source"), r.get("config_hash")))
        seen_categories.add(r["category"])
        for category in (r["category"], OVERALL):
            plain = by_method.get((prompt_key(r), r.get("plain", baseline)))
            cells.setdefault((name, category), Cell(seed=seed)).add(r, baseline_of.get(prompt_key(r)), plain)
    order = [c for c in CATEGORIES if c in seen_categories] + sorted(seen_categories - set(CATEGORIES))
    warnings = tuple(
        f"method {m} mixes {len(h)} configurations (config_hash); summarize one configuration at a time."
        for m, h in methods.items() if len({c for _, c in h}) > 1
    )
    if not any(r["method"] == baseline for r in records) and records:
        warnings += (f"no `{baseline}` records: speedups are undefined.",)
    return Summary(list(methods), order + [OVERALL], cells, baseline, warnings, own_plains)


def summarize_file(path, config_hashes: Sequence[str] | None = None) -> Summary:
    """Summary of a results file, optionally only of the records with the given config hashes; its
    warnings name the question turns a method failed on (`FAILURE_FILE` beside it)."""
    records, duplicates = unique_records(check_schema(read_records(path), str(path)), str(path))
    if config_hashes is not None:
        records = [r for r in records if r["config_hash"] in set(config_hashes)]
    summary = summarize(records)
    failed = failure_warnings(read_records(beside(Path(path).parent, FAILURE_FILE)), records, config_hashes)
    return replace(summary, warnings=(*([duplicates] if duplicates else []), *summary.warnings, *failed))
