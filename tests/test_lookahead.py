"""drafter=lookahead: lossless with every verifier, its Jacobi window laid out as the paper's
mask (a guess of level l in column c at depth c + l), its pool fed by the target's own
predictions, and its settings checked."""

from __future__ import annotations

import pytest
import torch

from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.draft import ROOT
from spec_zoo.drafters.lookahead import LookaheadDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from spec_zoo.testing import CERTIFY_SETTINGS, assert_greedy_identity, assert_lossless, repetitive_prompt, tiny_llama


def test_greedy_identity():
    assert_greedy_identity(lambda model: LookaheadDrafter())
    assert_greedy_identity(lambda model: LookaheadDrafter(window=3, ngram=4, guesses=2, pool_from_prompt=True),
                           seeds=(4,))


@pytest.mark.parametrize("setting", list(CERTIFY_SETTINGS))
def test_sampling_is_certified_exact_with_rejection(setting):
    """Exact, not sampled: the law of every generated sequence equals the target's, with the
    Jacobi window and the pool proposing (tau above 1; 4 tokens, so the pool has n-grams)."""
    cert = assert_lossless(lambda model: LookaheadDrafter(window=2, ngram=2, guesses=2),
                           sampling=CERTIFY_SETTINGS[setting], length=4)
    assert cert.tau > 1.0


def _state(tokens, max_depth=50):
    return DecodeState(list(tokens), len(tokens), max_depth, SamplingParams(), torch.Generator())


def test_window_is_a_tree_with_the_jacobi_layout_and_feeds_the_pool():
    W, N = 4, 3
    drafter = LookaheadDrafter(window=W, ngram=N, guesses=2)
    state = _state([5, 6, 7, 8, 9])
    drafter.begin(state)
    first = drafter.propose(state)
    assert len(first) <= W and first.parents[0] == ROOT  # warm-up: the level-0 chain only
    vocab = 16
    # the target "predicts" token 10 + depth everywhere: the next level and the n-grams follow it
    state.draft_logits = torch.nn.functional.one_hot(torch.tensor([0] + [10 + d for d in first.depths]), vocab).float()
    second = drafter.propose(state)
    assert drafter.levels[1] == [10, 11, 12, 13]  # the argmax after spine column c
    nodes = drafter._scored[1]
    for level, row in enumerate(nodes):
        for column, node in enumerate(row):
            assert second.depths[node] == column + level  # what the paper's mask lets it see
    state.draft_logits = torch.nn.functional.one_hot(torch.tensor([0] + [10 + d for d in second.depths]), vocab).float()
    drafter.propose(state)  # window full: one n-gram per column enters the pool, levels shift
    assert drafter.levels == [[10, 11, 12, 13], [11, 12, 13, 14]]
    grams = {(first, *rest) for first, kept in drafter.pool.items() for rest in kept}
    assert {gram[1:] for gram in grams} == {(10, 11), (11, 12), (12, 13), (13, 14)}


def test_pool_ngrams_are_verified_after_their_first_token_and_the_size_is_bounded():
    model = tiny_llama(2, sharpness=3.0)
    W, N, G = 3, 3, 2
    drafter = LookaheadDrafter(window=W, ngram=N, guesses=G, pool_from_prompt=True)
    decoder = SpeculativeDecoder(Target(model), drafter)
    sizes = []
    inner = drafter.propose

    def propose(state):
        draft = inner(state)
        sizes.append(len(draft))
        return draft

    drafter.propose = propose
    out = decoder.generate(repetitive_prompt(2), max_new_tokens=30, eos_token_ids=[])
    assert max(sizes) <= W * (N - 1) + G * (N - 1)
    assert out.stats.tau > 1.0  # the repetitive prompt's n-grams are accepted
    assert all(len(kept) <= G for kept in drafter.pool.values())


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"ngram": 1}, {"guesses": -1}])
def test_bad_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError, match="drafter\\."):
        LookaheadDrafter(**kwargs)
