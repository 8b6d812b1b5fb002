"""Lossless at temperature 0: every drafter x exact verifier reproduces the target's
plain greedy decoding token for token (tiny float64 models, so no near-ties)."""

import pytest

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.testing import repetitive_prompt
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import drafter_lineup
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

SEEDS = [0, 1, 2, 3, 4]
MAX_NEW = 40


_prompt = repetitive_prompt  # a repetitive prompt, so prompt lookup finds matches


@pytest.fixture(scope="module", params=SEEDS)
def case(request):
    model = tiny_llama(request.param, sharpness=3.0)
    prompt = _prompt(request.param)
    return model, prompt, hf_greedy(model, prompt, MAX_NEW)


@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
@pytest.mark.parametrize("drafter", list(drafter_lineup(tiny_llama(0))))
def test_matches_plain_greedy(case, drafter, verifier):
    model, prompt, reference = case
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter](), verifier(), SamplingParams())
    out = decoder.generate(prompt, max_new_tokens=MAX_NEW, eos_token_ids=[])
    assert out.ids == reference
    assert out.finish_reason == "length" and len(out.ids) == MAX_NEW
    assert out.stats.new_tokens == MAX_NEW


@pytest.mark.parametrize("drafter", list(drafter_lineup(tiny_llama(0))))
def test_stops_at_eos_in_the_middle(case, drafter):
    model, prompt, reference = case
    eos = reference[12]  # a token the target emits mid-way: treat it as end of sequence
    expected = reference[: reference.index(eos) + 1]
    assert expected == hf_greedy(model, prompt, MAX_NEW, eos=eos)
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter]())
    out = decoder.generate(prompt, max_new_tokens=MAX_NEW, eos_token_ids=[eos])
    assert out.ids == expected and out.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_never_emits_past_the_limit(case, max_new):
    model, prompt, reference = case
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)["small_chain_self"]())
    out = decoder.generate(prompt, max_new_tokens=max_new, eos_token_ids=[])
    assert out.ids == reference[:max_new]


def test_baseline_tau_is_one_and_alpha_undefined(case):
    model, prompt, _ = case
    out = SpeculativeDecoder(Target(model)).generate(prompt, max_new_tokens=10, eos_token_ids=[])
    assert out.stats.tau == 1.0 and out.stats.alpha is None
    assert out.stats.target_forwards == 10 and out.stats.accept_per_position == []


def test_ngram_tau_above_one_on_a_repetitive_prompt():
    model = tiny_llama(7, sharpness=3.0)
    # greedy decoding of a random model soon loops; prompt lookup copies the loop
    prompt = [5, 6, 7, 8] * 4
    reference = hf_greedy(model, prompt, 60)
    out = SpeculativeDecoder(Target(model), drafter_lineup(model)["ngram_k4_adaptive"]()).generate(
        prompt + reference[:20], max_new_tokens=40, eos_token_ids=[]
    )
    assert out.ids == reference[20:60]
    assert out.stats.tau > 1.0 and out.stats.alpha > 0


def test_same_seed_same_sample():
    model = tiny_llama(8, sharpness=3.0)
    decoder = SpeculativeDecoder(
        Target(model), drafter_lineup(model, sampled=True)["small_chain_k3"](), sampling=SamplingParams(temperature=1.0)
    )
    a = decoder.generate([3, 4, 5], max_new_tokens=20, eos_token_ids=[], seed=11).ids
    b = decoder.generate([3, 4, 5], max_new_tokens=20, eos_token_ids=[], seed=11).ids
    c = decoder.generate([3, 4, 5], max_new_tokens=20, eos_token_ids=[], seed=12).ids
    assert a == b and a != c
