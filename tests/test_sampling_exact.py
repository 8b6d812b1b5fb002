"""Lossless at temperature > 0: tokens generated through every drafter x rejection
sampling follow the target's own sampling distribution.

On a tiny model with an 8-token vocabulary we compute the exact distribution of the
first three generated tokens (512 sequences) and compare samples against it with a
chi-square goodness-of-fit test. A deliberately broken rule (accept every draft
token) must fail the same test, so the test has the power to catch real bugs.
"""

import pytest
import torch

from spec_zoo import Draft, SpeculativeDecoder, Target, Verdict, Verifier, logits_to_probs
from spec_zoo.testing import (  # noqa: F401 (the harness lives in spec_zoo.testing; other tests import it from here)
    P_MIN,
    PROMPT,
    SETTINGS,
    VOCAB,
    exact_distribution,
    sampling_model,
)
from spec_zoo.testing import sampling_pvalue as _check
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import drafter_lineup
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def model():
    return sampling_model()


# every drafter family at T=1; top-k/top-p truncation through the chain and the tree
CASES = [
    ("none", "t1"),
    ("ngram_k4_adaptive", "t1"),
    ("small_chain_k3", "t1"),
    ("small_tree_2x3", "t1"),
    ("small_chain_k3", "t0.7_topk5_topp0.9"),
    ("small_tree_2x3", "t0.7_topk5_topp0.9"),
    ("early_exit_k3", "t1"),
    ("early_exit_k3_no_reuse", "t0.7_topk5_topp0.9"),
    ("early_exit_adapter_no_reuse", "t0.7_topk5_topp0.9"),
    ("eagle_k3", "t1"),
    ("eagle_adaptive", "t0.7_topk5_topp0.9"),
    ("medusa_k3", "t0.7_topk5_topp0.9"),
    ("medusa_tree", "t1"),
    # composed drafters (drafters/cascade.py, drafters/merge.py): sampled members keep their q
    ("cascade_ngram_small", "t1"),
    ("cascade_ngram_eagle", "t0.7_topk5_topp0.9"),
    ("merge_ngram_small", "t1"),
    ("merge_tree_eagle_ngram", "t0.7_topk5_topp0.9"),
    ("merge_sampled_twins", "t1"),
]
DETERMINISTIC_DRAFTERS = ["small_chain_k3", "small_tree_3x2_self", "early_exit_adapter", "eagle_k3",
                          "merge_tree_eagle_ngram"]


def test_target_distribution_is_not_trivial(model):
    probs = exact_distribution(model, SETTINGS["t1"])
    assert probs.max() < 0.5 and (probs > 0.005).sum() > 20  # many plausible sequences


@pytest.mark.parametrize("drafter,setting", CASES)
def test_sampled_drafts_follow_target(model, drafter, setting):
    pvalue, _ = _check(model, drafter_lineup(model, sampled=True)[drafter](), SETTINGS[setting])
    assert pvalue > P_MIN


@pytest.mark.parametrize("drafter", DETERMINISTIC_DRAFTERS)
def test_deterministic_drafts_follow_target(model, drafter):
    """Greedy (top-k) drafts verified at temperature > 0: q is one-hot."""
    pvalue, _ = _check(model, drafter_lineup(model, sampled=False)[drafter](), SETTINGS["t1"])
    assert pvalue > P_MIN


class AcceptEverything(Verifier):
    """A broken rule: keeps the whole first path and samples the bonus token."""

    name = "broken"

    def verify(self, draft: Draft, target_logits, sampling, generator) -> Verdict:
        path = draft.path_to(len(draft) - 1) if len(draft) else []
        row = path[-1] + 1 if path else 0
        probs = logits_to_probs(target_logits[row], sampling)
        return Verdict(path, int(torch.multinomial(probs, 1, generator=generator)), bonus=True)


class SkipResidual(RejectionVerifier):
    """A subtler broken rule: on rejection, resample from p instead of norm(max(0, p - q))."""

    def verify(self, draft, target_logits, sampling, generator):
        verdict = super().verify(draft, target_logits, sampling, generator)
        if not verdict.bonus:
            row = verdict.path[-1] + 1 if verdict.path else 0
            probs = logits_to_probs(target_logits[row], sampling)
            verdict.next_token = int(torch.multinomial(probs, 1, generator=generator))
        return verdict


@pytest.mark.parametrize("broken", [AcceptEverything, SkipResidual])
def test_broken_rules_fail(model, broken):
    pvalue, _ = _check(model, drafter_lineup(model, sampled=True)["small_chain_k3"](), SETTINGS["t1"], broken())
    assert pvalue < P_MIN  # the same test that the correct rules pass


def test_drafts_are_partly_accepted(model):
    """The line-up is informative: the sampled chain drafter is neither always nor never right."""
    decoder = SpeculativeDecoder(
        Target(model), drafter_lineup(model, sampled=True)["small_chain_k3"](), sampling=SETTINGS["t1"]
    )
    alphas = [decoder.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], seed=s).stats.alpha for s in range(30)]
    mean = sum(alphas) / len(alphas)
    assert 0.2 < mean < 0.9
