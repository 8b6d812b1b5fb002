"""Per method x category summary of a results file, Spec-Bench style.

speedup:    (sum new_tokens / sum wall_s) of the method over the same of the baseline ``ar``
            on the same prompts (question, turn, repeat): pooled, not a mean of per-prompt
            ratios, so long answers weigh as much as they cost.
tau:        sum new_tokens / sum target_forwards (tokens committed per target forward).
alpha:      sum accepted / sum drafted.
match rate: share of comparable records whose output equals the baseline's.
"overall" pools every category. Pure functions of the records: usable on any results file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spec_zoo.bench.dataset import CATEGORIES
from spec_zoo.bench.records import BASELINE, read_records

OVERALL = "overall"


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

    def add(self, r: dict, base: dict | None) -> None:
        """Count record ``r``; ``base`` is the baseline's record for the same prompt, if any."""
        self.records += 1
        if base is not None:
            self.paired_tokens += r["new_tokens"]
            self.paired_wall_s += r["wall_s"]
            self.base_tokens += base["new_tokens"]
            self.base_wall_s += base["wall_s"]
        self.new_tokens += r["new_tokens"]
        self.wall_s += r["wall_s"]
        if r.get("target_forwards") is not None:
            self.counted_tokens += r["new_tokens"]
            self.target_forwards += r["target_forwards"]
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
    def tau(self) -> float | None:
        return self.counted_tokens / self.target_forwards if self.target_forwards else None

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def match_rate(self) -> float | None:
        return self.matches / self.compared if self.compared else None


@dataclass
class Summary:
    methods: list[str]  # in first-seen order (the run order: baseline first)
    categories: list[str]  # report order, OVERALL last
    cells: dict[tuple[str, str], Cell]
    baseline: str = BASELINE
    warnings: tuple[str, ...] = ()

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
        lines = ["# Benchmark summary", ""]
        lines += [f"> warning: {w}" for w in self.warnings]
        for title, stat, fmt in tables:
            lines += [f"## {title}", "", "| method | " + " | ".join(self.categories) + " |",
                      "|---" * (len(self.categories) + 1) + "|"]
            for m in self.methods:
                cells = [("-" if (v := self.get(m, c, stat)) is None else fmt.format(v)) for c in self.categories]
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            lines.append("")
        counts = ", ".join(f"{m}: {self.cells[(m, OVERALL)].records}" for m in self.methods)
        lines.append(f"Records per method: {counts}. "
                     "`-`: not measured or not defined (e.g. tau of a transformers reference).")
        return "\n".join(lines) + "\n"


def summarize(records: Iterable[dict], baseline: str = BASELINE) -> Summary:
    """Pool records per (method, category) and overall."""
    records = list(records)
    prompt = lambda r: (r["question_id"], r["turn"], r["repeat"])  # noqa: E731
    baseline_of = {prompt(r): r for r in records if r["method"] == baseline}
    cells: dict[tuple[str, str], Cell] = {}
    methods: dict[str, set] = {}
    seen_categories = set()
    for r in records:
        methods.setdefault(r["method"], set()).add(r.get("config_hash"))
        seen_categories.add(r["category"])
        for category in (r["category"], OVERALL):
            cells.setdefault((r["method"], category), Cell()).add(r, baseline_of.get(prompt(r)))
    order = [c for c in CATEGORIES if c in seen_categories] + sorted(seen_categories - set(CATEGORIES))
    warnings = tuple(
        f"method {m} mixes {len(h)} configurations (config_hash); summarize one configuration at a time."
        for m, h in methods.items() if len(h) > 1
    )
    if baseline not in methods and methods:
        warnings += (f"no `{baseline}` records: speedups are undefined.",)
    return Summary(list(methods), order + [OVERALL], cells, baseline, warnings)


def summarize_file(path, config_hashes: Sequence[str] | None = None) -> Summary:
    """Summary of a results file, optionally only of the records with the given config hashes."""
    records = read_records(path)
    if config_hashes is not None:
        records = [r for r in records if r["config_hash"] in set(config_hashes)]
    return summarize(records)
