"""A batch of requests (`SpeculativeDecoder.generate_batch`): each request's output is exactly
its output decoded alone, at every batch size, for every drafter (docs/batching.md)."""

import pytest

import spec_zoo
from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.testing import repetitive_prompt, tiny_family
from tests.drafts import drafter_lineup
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)

MAX_NEW = 8
SIZES = [1, 2, 3, 8, 16]
# 16 requests of mixed lengths (5..20 tokens), continuing different repetitive prompts
PROMPTS = [repetitive_prompt(i)[: 5 + i] for i in range(16)]


def _alone(model, prompts, eos):
    """Reference: plain decoding, one request at a time on a fresh decoder each."""
    return [SpeculativeDecoder(Target(model)).generate(p, MAX_NEW, eos_token_ids=eos).ids for p in prompts]


@pytest.fixture(scope="module")
def case():
    model = tiny_llama(0, sharpness=3.0)
    free = _alone(model, PROMPTS, [])
    eos = [free[0][3]]  # a token some requests emit early: they end by eos, the others by length
    return model, eos, _alone(model, PROMPTS, eos)


@pytest.mark.parametrize("drafter", list(drafter_lineup(tiny_llama(0))))
def test_each_request_equals_its_batch_1_output(case, drafter):
    model, eos, reference = case
    assert any(len(r) < MAX_NEW for r in reference) and any(len(r) == MAX_NEW for r in reference)
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter]())
    for size in SIZES:
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=size)
        assert [o.ids for o in outs] == reference, f"batch_size={size}"
        assert [o.stats.new_tokens for o in outs] == [len(r) for r in reference]
        assert [o.prompt_ids for o in outs] == PROMPTS


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
def test_other_families(family):
    model = tiny_family(family)
    reference = _alone(model, PROMPTS[:6], [])
    decoder = SpeculativeDecoder(Target(model), NgramDrafter(branches=2))
    assert decoder.slots(3) == 3  # the ngram drafter and the eager target interleave requests
    assert [o.ids for o in decoder.generate_batch(PROMPTS[:6], MAX_NEW, eos_token_ids=[], batch_size=3)] == reference


@pytest.mark.parametrize("branches", [1, 2], ids=["chain", "tree"])
def test_sampled_batch_of_2_equals_each_request_alone(branches):
    model = tiny_llama(0)
    sampling = SamplingParams(temperature=1.0)
    prompts, seeds = PROMPTS[3:5], [11, 12]

    def decoder():
        return SpeculativeDecoder(Target(model), NgramDrafter(branches=branches), sampling=sampling)

    alone = [decoder().generate(p, 16, eos_token_ids=[], seed=s).ids for p, s in zip(prompts, seeds, strict=True)]
    batched = decoder()
    assert batched.slots(2) == 2
    outs = batched.generate_batch(prompts, 16, eos_token_ids=[], seeds=seeds, batch_size=2)
    assert [o.ids for o in outs] == alone
    assert alone[0] != alone[1]


def test_bad_batch_arguments_are_refused_before_decoding(case):
    model, _, _ = case
    decoder = SpeculativeDecoder(Target(model))
    with pytest.raises(ConfigError, match="batch_size"):
        decoder.generate_batch(PROMPTS, batch_size=0)
    with pytest.raises(ConfigError, match="seeds: 1 given for 2 prompts"):
        decoder.generate_batch(PROMPTS[:2], seeds=[1])
    with pytest.raises(ConfigError, match="empty"):
        decoder.generate_batch([PROMPTS[0], []])


def test_the_one_call_api_takes_a_list_of_prompts(case):
    model, _, _ = case
    target = Target(model)
    outs = spec_zoo.generate(PROMPTS[:3], drafter="ngram", model=target, max_new_tokens=MAX_NEW, batch_size=2)
    alone = [spec_zoo.generate(p, drafter="ngram", model=target, max_new_tokens=MAX_NEW) for p in PROMPTS[:3]]
    assert isinstance(outs, list) and [o.ids for o in outs] == [o.ids for o in alone]
