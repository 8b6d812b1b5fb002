"""Lossless at temperature > 0: tokens generated through every drafter x rejection
sampling follow the target's own sampling distribution, exactly.

`spec_zoo.testing.assert_lossless` enumerates every random choice of the decode
(`spec_zoo.certify`) on a 4-token tiny model and compares the exact law of the three
generated tokens with the target's (total variation <= 1e-9: float64 rounding). Deliberately
broken rules must fail the same check, with TV >= 1e-3. (The chi-square check,
`assert_sampling_exact`, stays for the real model, which no enumeration reaches.)
"""

import re

import pytest

from spec_zoo import Draft, SpeculativeDecoder, Target, Verdict, Verifier, logits_to_probs
from spec_zoo.certify import target_law
from spec_zoo.sampling import sample
from spec_zoo.testing import (  # noqa: F401 (the harness lives in spec_zoo.testing; other tests import it from here)
    CERTIFY_PROMPT,
    CERTIFY_SETTINGS,
    P_MIN,
    PROMPT,
    SETTINGS,
    VOCAB,
    assert_lossless,
    certify_model,
    sampling_model,
)
from tests.drafts import drafter_lineup
from tests.test_certify import SkipResidual
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

T1, T07 = "t1", "t0.7_topk3_topp0.75"


@pytest.fixture(scope="module")
def model():
    return certify_model()


# every drafter family; T=1 where the choice tree is small, else T=0.7 with top-k and top-p
CASES = [
    ("none", T1),
    ("ngram_k4_adaptive", T1),
    ("small_chain_k3", T1),
    ("small_chain_k3", T07),
    ("small_tree_2x3", T07),
    ("early_exit_k3", T07),
    ("early_exit_k3_no_reuse", T07),
    ("early_exit_adapter_no_reuse", T07),
    ("eagle_k3", T1),
    ("eagle_adaptive", T07),
    ("medusa_k3", T1),
    ("medusa_k3", T07),
    ("medusa_tree", T1),
    # composed drafters (drafters/cascade.py, drafters/merge.py): sampled members keep their q
    ("cascade_ngram_small", T1),
    ("cascade_ngram_eagle", T1),
    ("merge_ngram_small", T07),
    ("merge_tree_eagle_ngram", T07),
    ("merge_sampled_twins", T07),
]
DETERMINISTIC_DRAFTERS = ["small_chain_k3", "small_tree_3x2_self", "early_exit_adapter", "eagle_k3",
                          "merge_tree_eagle_ngram"]


def test_target_distribution_is_not_trivial(model):
    law = target_law(model, CERTIFY_SETTINGS[T1], CERTIFY_PROMPT, 3)
    assert max(law.values()) < 0.5 and sum(p > 0.005 for p in law.values()) > 20  # many plausible sequences


@pytest.mark.parametrize("drafter,setting", CASES)
def test_sampled_drafts_follow_target(model, drafter, setting):
    assert_lossless(lambda m: drafter_lineup(m, sampled=True)[drafter](), sampling=CERTIFY_SETTINGS[setting],
                    model=model)


@pytest.mark.parametrize("drafter", DETERMINISTIC_DRAFTERS)
def test_deterministic_drafts_follow_target(model, drafter):
    """Greedy (top-k) drafts verified at temperature > 0: q is one-hot."""
    assert_lossless(lambda m: drafter_lineup(m, sampled=False)[drafter](), model=model)


class AcceptEverything(Verifier):
    """A broken rule: keeps the whole first path and samples the bonus token."""

    name = "broken"

    def verify(self, draft: Draft, target_logits, sampling, generator) -> Verdict:
        path = draft.path_to(len(draft) - 1) if len(draft) else []
        row = path[-1] + 1 if path else 0
        probs = logits_to_probs(target_logits[row], sampling)
        return Verdict(path, int(sample(probs, generator)), bonus=True)


@pytest.mark.parametrize("broken", [AcceptEverything, SkipResidual])
def test_broken_rules_fail(model, broken):
    with pytest.raises(AssertionError, match="exact total variation") as failed:  # the check the correct rules pass
        assert_lossless(lambda m: drafter_lineup(m, sampled=True)["small_chain_k3"](), broken(),
                        CERTIFY_SETTINGS[T07], model)
    assert float(re.search(r"variation ([0-9.e+-]+)", str(failed.value)).group(1)) >= 1e-3


def test_drafts_are_partly_accepted():
    """The line-up is informative: the sampled chain drafter is neither always nor never right."""
    model = sampling_model()
    decoder = SpeculativeDecoder(
        Target(model), drafter_lineup(model, sampled=True)["small_chain_k3"](), sampling=SETTINGS["t1"]
    )
    alphas = [decoder.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], seed=s).stats.alpha for s in range(30)]
    mean = sum(alphas) / len(alphas)
    assert 0.2 < mean < 0.9
