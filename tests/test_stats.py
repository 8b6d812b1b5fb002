"""Speedup statistics on synthetic data with known answers: pooled ratio, median over
repeats, and the paired prompt-level bootstrap CI (exact when there is no noise, equal to
scipy's percentile bootstrap, ~95% coverage of a known true speedup)."""

from __future__ import annotations

import numpy as np
import pytest

from spec_zoo.bench.stats import (
    Pair,
    bootstrap_ci,
    median_speedup,
    per_repeat_speedups,
    pooled_speedup,
    specbench_speedup,
    speedup_stats,
)
from spec_zoo.bench.summary import OVERALL, summarize


def pairs_from(seconds, base_seconds, tokens=100, repeats=None):
    repeats = repeats or [0] * len(seconds)
    return [Pair((i, 1), r, tokens, s, tokens, b) for i, (s, b, r) in enumerate(zip(seconds, base_seconds, repeats))]


def test_no_noise_gives_the_exact_speedup_and_a_zero_width_interval():
    rng = np.random.default_rng(0)
    seconds = rng.uniform(0.5, 3.0, 40)
    pairs = pairs_from(seconds, 2.5 * seconds)
    assert pooled_speedup(pairs) == pytest.approx(2.5)
    low, high = bootstrap_ci(pairs)
    assert low == pytest.approx(2.5) and high == pytest.approx(2.5)


def test_pooled_is_summed_tokens_over_summed_seconds_not_a_mean_of_ratios():
    pairs = [Pair((1, 1), 0, 10, 1.0, 10, 1.0), Pair((2, 1), 0, 100, 1.0, 100, 10.0)]
    assert pooled_speedup(pairs) == pytest.approx((110 / 2.0) / (110 / 11.0))  # 5.5, not (1 + 10) / 2


def test_specbench_speedup_is_a_mean_over_questions_of_per_question_throughput():
    # question 1: two turns (10 tok in 1 s, 30 tok in 1 s) -> 20 tok/s; baseline 40 tok in 4 s -> 10 tok/s
    # question 2: 100 tok in 1 s -> 100 tok/s; baseline 100 tok in 2 s -> 50 tok/s
    pairs = [Pair(("f", 1, 1), 0, 10, 1.0, 10, 2.0), Pair(("f", 1, 2), 0, 30, 1.0, 30, 2.0),
             Pair(("f", 2, 1), 0, 100, 1.0, 100, 2.0)]
    assert specbench_speedup(pairs) == pytest.approx(((20 + 100) / 2) / ((10 + 50) / 2))
    assert pooled_speedup(pairs) == pytest.approx((140 / 3) / (140 / 6))
    # repeats: the mean of the per-repeat ratios (Spec-Bench's mean over runs)
    again = [Pair(p.prompt, 1, p.tokens, p.seconds / 2, p.base_tokens, p.base_seconds) for p in pairs]
    assert specbench_speedup(pairs + again) == pytest.approx((2.0 + 4.0) / 2)


def test_median_over_repeats():
    pairs = [Pair((q, 1), r, 10, 1.0, 10, s) for r, s in enumerate([1.0, 3.0, 2.0, 10.0, 2.5]) for q in range(3)]
    assert per_repeat_speedups(pairs) == pytest.approx({0: 1.0, 1: 3.0, 2: 2.0, 3: 10.0, 4: 2.5})
    assert median_speedup(pairs) == pytest.approx(2.5)
    stats = speedup_stats(pairs)
    assert stats.prompts == 3 and stats.repeats == 5
    assert stats.ci == (pytest.approx(3.7), pytest.approx(3.7))  # every prompt has the same sums


def test_bootstrap_matches_scipy_percentile_bootstrap():
    from scipy.stats import bootstrap

    rng = np.random.default_rng(1)
    n = 50
    seconds = rng.gamma(4.0, 0.5, n)
    tokens = rng.integers(20, 200, n).astype(float)
    base = 1.8 * seconds * np.exp(rng.normal(0, 0.3, n))
    pairs = [Pair((i, 1), 0, t, s, t, b) for i, (t, s, b) in enumerate(zip(tokens, seconds, base))]

    def stat(idx):
        idx = idx.astype(int)
        return (tokens[idx].sum() / seconds[idx].sum()) / (tokens[idx].sum() / base[idx].sum())

    ref = bootstrap((np.arange(n),), stat, vectorized=False, n_resamples=4000, method="percentile",
                    random_state=np.random.default_rng(2)).confidence_interval
    low, high = bootstrap_ci(pairs, n_boot=4000)
    assert low == pytest.approx(ref.low, rel=0.02) and high == pytest.approx(ref.high, rel=0.02)
    assert low < pooled_speedup(pairs) < high
    assert bootstrap_ci(pairs, n_boot=4000) == (low, high)  # seeded: reproducible


def test_bootstrap_covers_the_true_speedup_about_95_percent_of_the_time():
    true = 2.0 * np.exp(0.25**2 / 2)  # E[base seconds] / E[seconds] with lognormal noise
    rng = np.random.default_rng(3)
    covered, widths = 0, []
    trials = 200
    for t in range(trials):
        seconds = rng.gamma(5.0, 0.4, 60)
        base = 2.0 * seconds * np.exp(rng.normal(0, 0.25, 60))
        low, high = bootstrap_ci(pairs_from(seconds, base), n_boot=400, seed=t)
        covered += low <= true <= high
        widths.append(high - low)
    assert 0.88 <= covered / trials <= 0.99
    # four times the prompts: about half the width
    seconds = rng.gamma(5.0, 0.4, 240)
    low, high = bootstrap_ci(pairs_from(seconds, 2.0 * seconds * np.exp(rng.normal(0, 0.25, 240))))
    assert 0.35 < (high - low) / np.mean(widths) < 0.7


def test_one_prompt_has_no_interval():
    assert bootstrap_ci([Pair((1, 1), 0, 10, 1.0, 10, 2.0)]) is None


def test_summary_carries_ci_median_predicted_and_equality():
    def rec(method, qid, repeat, wall, forwards, draft_s=None, verify_s=None, match=None, margin=None, pos=None):
        return {"method": method, "category": "qa", "question_id": qid, "turn": 1, "repeat": repeat,
                "new_tokens": 10, "wall_s": wall, "target_forwards": forwards, "drafted": None, "accepted": None,
                "matches_baseline": match, "top2_margin_at_mismatch": margin, "draft_s": draft_s,
                "verify_s": verify_s, "accept_per_position": pos, "config_hash": method}

    records = []
    for q in range(4):
        for r in range(3):
            records.append(rec("ar", q, r, 1.0, 10, 0.0, 1.0))
            records.append(rec("ngram", q, r, 0.5, 5, 0.05, 0.45, match=q != 0, margin=0.01 if q == 0 else None,
                               pos=[1.0, 0.5] if q % 2 else [0.5]))
    s = summarize(records)
    cell = s.cells["ngram", OVERALL]
    assert cell.speedup == pytest.approx(2.0) and cell.speedup_median == pytest.approx(2.0)
    assert cell.speedup_ci == (pytest.approx(2.0), pytest.approx(2.0))
    # tau 2, ar 0.1 s/token, drafting 0.01 s per forward: predicted 2 x 0.1 / 0.11
    assert cell.predicted_speedup == pytest.approx(2 * 0.1 / 0.11)
    assert cell.accept_per_position == pytest.approx([0.75, 0.5])
    assert cell.mismatches == 3 and cell.near_ties == 3 and cell.equality.startswith("9/12 (3 of 3 near-ties")
    md = s.to_markdown()
    assert "| ngram | [2.00, 2.00] | [2.00, 2.00] |" in md and "Predicted speedup" in md
