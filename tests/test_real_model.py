"""End-to-end truths on the embedded SmolLM2-135M target: every drafter x greedy
verification reproduces plain greedy decoding on Spec-Bench prompts.

A batched forward can differ from a one-token forward in the last float bits, so a
mismatch is tolerated only where the target's top-2 logits nearly tie at the first
differing position (the margin is printed and bounded).
"""

import pytest

from spec_zoo import SpeculativeDecoder
from spec_zoo.bench.dataset import load_questions
from spec_zoo.bench.runner import first_difference, top2_margin
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.models import make_truncated_draft
from tests.tiny import hf_greedy

pytestmark = pytest.mark.real_model
MAX_NEW = 48
NEAR_TIE = 0.05  # logits; a real disagreement would show margins of whole units


@pytest.fixture(scope="module")
def prompts(smollm2_target):
    decoder = SpeculativeDecoder(smollm2_target)
    questions = load_questions(per_category=1)[:3]
    return [decoder.encode(q.turns[0]) for q in questions]


@pytest.fixture(scope="module")
def references(smollm2_target, prompts):
    eos = smollm2_target.tokenizer.eos_token_id
    return [hf_greedy(smollm2_target.model, p, MAX_NEW, eos=eos) for p in prompts]


@pytest.fixture(scope="module")
def draft_dir(smollm2_target, tmp_path_factory):
    return make_truncated_draft(smollm2_target.model, 4, tmp_path_factory.mktemp("draft") / "trunc4")


DRAFTERS = {  # name: (drafter, how many of the prompts it decodes)
    "none": (lambda d: None, 3),
    "ngram": (lambda d: NgramDrafter(), 3),
    # a model draft costs a forward per drafted level on the real target: CI time goes to breadth
    # (tests/test_trees.py and tests/test_greedy_identity.py prove every tree policy on tiny models), so the
    # real target checks the chain on two prompts and the tree on the first
    "small_model": (lambda d: SmallModelDrafter(d, num_draft=4), 2),
    "small_model_tree": (lambda d: SmallModelDrafter(d, tree_width=2, tree_depth=3), 1),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_identity_on_spec_bench(smollm2_target, prompts, references, draft_dir, name):
    make, count = DRAFTERS[name]
    decoder = SpeculativeDecoder(smollm2_target, make(draft_dir))
    for prompt, reference in zip(prompts[:count], references):
        out = decoder.generate(prompt, max_new_tokens=MAX_NEW)
        at = first_difference(out.ids, reference)
        if at is not None:
            margin = top2_margin(smollm2_target, prompt + reference[:at])
            print(f"{name}: mismatch at token {at}, target top-2 margin {margin:.4f}")
            assert margin < NEAR_TIE, f"{name} diverged at token {at} where the target is sure (margin {margin})"
        if name != "none":
            assert out.stats.target_forwards < len(out.ids) or out.stats.alpha == 0


def test_streamed_text_is_the_generated_text(smollm2_target, prompts):
    decoder = SpeculativeDecoder(smollm2_target, NgramDrafter())
    pieces = list(decoder.stream(prompts[0], max_new_tokens=32))
    out = decoder.generate(prompts[0], max_new_tokens=32)
    assert len(pieces) > 3 and "".join(pieces) == out.text


def test_stops_right_after_a_stop_string(smollm2_target, prompts, references):
    tokenizer = smollm2_target.tokenizer
    reference = references[0]
    full = tokenizer.decode(reference, skip_special_tokens=True)
    stop = full[len(tokenizer.decode(reference[:12], skip_special_tokens=True)) :].split()[0]
    decoder = SpeculativeDecoder(smollm2_target, NgramDrafter())
    out = decoder.generate(prompts[0], max_new_tokens=MAX_NEW, stop_strings=[stop])
    assert out.finish_reason == "stop_string"
    assert out.ids == reference[: len(out.ids)]
    assert stop in out.text and stop not in tokenizer.decode(out.ids[:-1], skip_special_tokens=True)


def test_compiled_runtime_decodes_as_eager_and_speculation_on_it_is_bit_exact(smollm2_target, prompts, references):
    """On the compiled runtime, plain decoding gives the eager text (up to near-ties: the
    kernels differ), and speculative decoding gives plain compiled decoding's text exactly:
    its scoring is batch-invariant, so there is no near-tie exception."""
    from spec_zoo.runtime import CompiledTarget

    compiled = CompiledTarget(smollm2_target.model, smollm2_target.tokenizer, max_cache_len=512)  # one compile
    plain, spec = SpeculativeDecoder(compiled), SpeculativeDecoder(compiled, NgramDrafter(num_draft=3, adaptive=False))
    for prompt, reference in zip(prompts[:2], references):
        ids = plain.generate(prompt, max_new_tokens=32).ids
        out = spec.generate(prompt, max_new_tokens=32)
        assert out.ids == ids
        at = first_difference(ids, reference[:32])
        if at is not None:
            assert top2_margin(smollm2_target, prompt + reference[:at]) < NEAR_TIE


def test_translation_prompts_are_the_targets_own_german(smollm2_target, tmp_path):
    import json

    from hydra import compose, initialize_config_dir

    from spec_zoo.registry import CONF_DIR
    from spec_zoo.train.translations import SOURCE, looks_german, make_translations

    news = [f"The mayor of {city} said that {place} will open again next week." for city in
            ("Berlin", "London", "Paris", "Madrid", "Rome", "Vienna") for place in
            ("the new bridge", "the old museum", "the city library", "the main station", "the football stadium")]
    src = tmp_path / "prompts.jsonl"  # 30 sentences; about one answer in eight looks German
    src.write_text("".join(json.dumps({"prompt": f"Summarize.\n\nArticle: {' '.join(news[i:i + 10])}",
                                       "source": "t0-cnn_dailymail"}) + "\n" for i in range(0, 30, 10)))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train_translations", overrides=[
            f"data.prompts={src}", f"translations.out={tmp_path / 'out.jsonl'}", "translations.num=2",
            "translations.sources=[t0-cnn_dailymail]", "translations.max_new_tokens=40", "data.batch_size=16",
            "progress=false", "threads=2"])
    lines = make_translations(cfg, target=smollm2_target).read_text().splitlines()
    assert lines[:3] == src.read_text().splitlines()  # the source's records first, unchanged
    made = [json.loads(line) for line in lines[3:]]
    assert 1 <= len(made) <= 2, made
    for record in made:
        assert record["source"] == SOURCE and record["english"] in news
        assert record["prompt"].startswith("Translate German to English: ")
        assert looks_german(record["prompt"].split(": ", 1)[1])
