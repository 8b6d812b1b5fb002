"""drafter=cross_tokenizer: a draft model of another vocabulary, lossless. Greedy identity
against plain decoding (a draft that always agrees, and a random one with merged tokens),
sampling certified by enumeration for both constructions (text drafting with q one-hot, and
token-level intersection), and a broken rule, TLI's q without its restriction, caught."""

from __future__ import annotations

import itertools
import string

import pytest

from spec_zoo.certify import certify
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.draft import Draft
from spec_zoo.drafters.cross_tokenizer import CrossTokenizerDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams, logits_to_probs, sample, to_full_vocab
from spec_zoo.testing import (
    CERTIFY_PROMPT,
    CERTIFY_SETTINGS,
    MAX_TV,
    assert_greedy_identity,
    certify_model,
    hf_greedy,
    repetitive_prompt,
    tiny_llama,
)
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import char_tokenizer, merged_draft, mirrored_draft
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

SYMBOLS = list(string.ascii_letters + string.digits)  # with <s> and </s>: tiny_llama's 64 tokens
MERGES = list(itertools.pairwise(SYMBOLS[:21]))  # "ab", "bc", ...: tokens only the draft has
CERTIFY_SYMBOLS, CERTIFY_MERGES = ["a", "b"], [("a", "b"), ("b", "a")]  # the 4-token certify model's texts
CAUGHT = 1e-3


def test_greedy_identity_with_a_random_draft_of_merged_tokens():
    draft, tokenizer = merged_draft(SYMBOLS, MERGES)
    assert_greedy_identity(lambda model: CrossTokenizerDrafter(draft, tokenizer, char_tokenizer(SYMBOLS)))


def test_a_draft_that_agrees_is_accepted_through_text():
    """The target under reversed ids drafts exactly what the target decodes: identity, and
    every step commits its whole draft (the text path loses nothing at the boundaries)."""
    for seed in (0, 1, 2):
        model = tiny_llama(seed, sharpness=3.0)
        draft, tokenizer = mirrored_draft(model, SYMBOLS)
        prompt = repetitive_prompt(seed)
        drafter = CrossTokenizerDrafter(draft, tokenizer, char_tokenizer(SYMBOLS), num_draft=4)
        out = SpeculativeDecoder(Target(model), drafter, RejectionVerifier(), SamplingParams()).generate(
            prompt, max_new_tokens=24, eos_token_ids=[])
        assert out.ids == hf_greedy(model, prompt, 24)
        assert len(out.stats.steps) <= 24 / 4, len(out.stats.steps)  # 4 drafted, the last dropped, one added


def drafter(sample, draft_parts, cls=CrossTokenizerDrafter):
    draft, tokenizer = draft_parts
    return lambda model: cls(draft, tokenizer, char_tokenizer(CERTIFY_SYMBOLS), num_draft=2, sample=sample)


@pytest.mark.parametrize("setting", list(CERTIFY_SETTINGS))
@pytest.mark.parametrize("sample", ["auto", False], ids=["tli", "text"])
@pytest.mark.parametrize("draft", ["merged", "mirrored"])
def test_sampling_is_certified_exact(draft, sample, setting):
    parts = (merged_draft(CERTIFY_SYMBOLS, CERTIFY_MERGES, sharpness=6.0) if draft == "merged"
             else mirrored_draft(certify_model(), CERTIFY_SYMBOLS))
    cert = certify(certify_model, drafter(sample, parts), RejectionVerifier(), CERTIFY_SETTINGS[setting],
                   CERTIFY_PROMPT, 3)
    assert cert.tv <= MAX_TV, cert.tv
    assert cert.tau > 1.0  # drafts were accepted: the check saw them


class UnrestrictedQ(CrossTokenizerDrafter):
    """Broken: samples the draft's full distribution (merged tokens too), proposes the first
    target token of the sampled text, and claims TLI's restricted q for it."""

    def _intersection_chain(self, state: DecodeState, mine: list[int], steps: int) -> Draft:
        logits = self.runner.score(mine, Draft.empty()).logits[-1]
        drafted = int(sample(logits_to_probs(logits, state.sampling), state.generator))
        token = self.target_tok.encode(self._text(self.draft_tok, [drafted]), add_special_tokens=False)[0]
        q = logits_to_probs(to_full_vocab(logits[self.shared_draft_ids], self.shared_target_ids, self.target_vocab),
                            state.sampling)
        return Draft.chain([token], q[None])


def test_unrestricted_draft_probs_are_caught():
    parts = merged_draft(CERTIFY_SYMBOLS, CERTIFY_MERGES, sharpness=6.0)
    cert = certify(certify_model, drafter("auto", parts, UnrestrictedQ), RejectionVerifier(), CERTIFY_SETTINGS["t1"],
                   CERTIFY_PROMPT, 3)
    assert cert.tv >= CAUGHT, cert.tv


def test_bad_setups_are_refused_by_name():
    draft, _ = merged_draft(CERTIFY_SYMBOLS, CERTIFY_MERGES)
    with pytest.raises(ConfigError, match="draft_tokenizer"):
        CrossTokenizerDrafter(draft).attach(Target(certify_model()))
    with pytest.raises(ConfigError, match="sample=false"):
        CrossTokenizerDrafter(draft, char_tokenizer(["x", "y"])).attach(
            Target(certify_model(), char_tokenizer(CERTIFY_SYMBOLS)))
