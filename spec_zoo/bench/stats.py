"""Statistics of a speedup: Spec-Bench's pooled ratio, its median over repeats, and a
paired bootstrap 95% confidence interval.

(`specbench_speedup` is Spec-Bench's exact formula, a mean over questions of per-question
throughput; `pooled_speedup` pools every token and second, so long answers weigh as much
as they cost. They differ when answer lengths and speedups vary together.)

A *pair* is one method record and the baseline record of the same prompt (question, turn)
and repeat, measured in the same run. The speedup of a set of pairs is Spec-Bench's:

    (sum of the method's new_tokens / sum of its wall_s) / (the same sums of the baseline)

The bootstrap resamples *prompts* (question, turn) with replacement, keeping all repeats
of a prompt and both sides of each pair together (a paired, prompt-level bootstrap: the
variation between prompts is what a different sample of prompts would change), and
recomputes the pooled speedup; the interval is the 2.5th and 97.5th percentiles (the
percentile method). It is seeded, so a report is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: resamples of the bootstrap; the percentile interval's Monte-Carlo error is well under 1%
N_BOOTSTRAP = 2000


@dataclass(frozen=True)
class Pair:
    """One measured prompt: the method's and the baseline's tokens and seconds."""

    prompt: tuple  # (..., question_id, turn) -- the unit the bootstrap resamples; turn last
    repeat: int
    tokens: float
    seconds: float
    base_tokens: float
    base_seconds: float


def pooled_speedup(pairs: Sequence[Pair]) -> float | None:
    """Spec-Bench's speedup of these pairs (None when undefined)."""
    tokens, seconds = sum(p.tokens for p in pairs), sum(p.seconds for p in pairs)
    base_tokens, base_seconds = sum(p.base_tokens for p in pairs), sum(p.base_seconds for p in pairs)
    if not (seconds and base_tokens and base_seconds):
        return None
    return (tokens / seconds) / (base_tokens / base_seconds)


def specbench_speedup(pairs: Sequence[Pair]) -> float | None:
    """Spec-Bench's own formula (evaluation/speed.py): per question, its tokens summed over
    turns / its seconds summed over turns; the mean of that over questions, for the method
    over the same for the baseline; with several repeats (Spec-Bench's runs), the mean of
    the per-repeat ratios. Every question weighs the same, however long its answers."""
    ratios = []
    for r in sorted({p.repeat for p in pairs}):
        questions: dict[tuple, list[float]] = {}
        for p in pairs:
            if p.repeat == r:
                q = questions.setdefault(p.prompt[:-1], [0.0, 0.0, 0.0, 0.0])
                q[0] += p.tokens
                q[1] += p.seconds
                q[2] += p.base_tokens
                q[3] += p.base_seconds
        sums = [q for q in questions.values() if q[1] > 0 and q[3] > 0]
        if sums:
            method = float(np.mean([q[0] / q[1] for q in sums]))
            base = float(np.mean([q[2] / q[3] for q in sums]))
            if base > 0:
                ratios.append(method / base)
    return float(np.mean(ratios)) if ratios else None


def per_repeat_speedups(pairs: Sequence[Pair]) -> dict[int, float]:
    """The pooled speedup of each repeat on its own."""
    repeats = sorted({p.repeat for p in pairs})
    out = {r: pooled_speedup([p for p in pairs if p.repeat == r]) for r in repeats}
    return {r: v for r, v in out.items() if v is not None}


def median_speedup(pairs: Sequence[Pair]) -> float | None:
    """Median over repeats of the per-repeat speedup (= the speedup with one repeat)."""
    values = list(per_repeat_speedups(pairs).values())
    return float(np.median(values)) if values else None


def bootstrap_ci(pairs: Sequence[Pair], n_boot: int = N_BOOTSTRAP, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of the pooled speedup under resampling prompts with replacement
    (all repeats of a prompt, method and baseline, move together). None with < 2 prompts."""
    units = sorted({p.prompt for p in pairs}, key=repr)
    if len(units) < 2:
        return None
    index = {u: i for i, u in enumerate(units)}
    sums = np.zeros((len(units), 4))
    for p in pairs:
        sums[index[p.prompt]] += (p.tokens, p.seconds, p.base_tokens, p.base_seconds)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(units), size=(n_boot, len(units)))
    counts = np.zeros((n_boot, len(units)))
    np.add.at(counts, (np.repeat(np.arange(n_boot), len(units)), draws.ravel()), 1)
    tok, sec, btok, bsec = (counts @ sums).T
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (tok / sec) / (btok / bsec)
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class SpeedupStats:
    """Everything a report says about one speedup."""

    speedup: float | None  # pooled over all pairs (Spec-Bench)
    median: float | None  # median of the per-repeat speedups
    ci: tuple[float, float] | None  # bootstrap 95% interval of the pooled speedup
    prompts: int
    repeats: int


def speedup_stats(pairs: Sequence[Pair], n_boot: int = N_BOOTSTRAP, seed: int = 0) -> SpeedupStats:
    return SpeedupStats(pooled_speedup(pairs), median_speedup(pairs), bootstrap_ci(pairs, n_boot, seed=seed),
                        len({p.prompt for p in pairs}), len({p.repeat for p in pairs}))
