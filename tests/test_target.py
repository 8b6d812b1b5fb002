"""The Draft IR and the target wrapper: tree scoring equals per-path scoring, and a
commit leaves the cache exactly as a fresh prefill of the committed tokens would."""

import pytest
import torch

from spec_zoo import Drafter, SpeculativeDecoder
from spec_zoo.draft import Draft
from spec_zoo.runtime.target import Target
from tests.tiny import hf_greedy, tiny_llama

# tree: 0 -> {2, 3}, 1 -> {4}, 3 -> {5}; first level nodes 0 and 1
TREE = Draft(torch.tensor([10, 11, 12, 13, 14, 15]), [-1, -1, 0, 0, 1, 3])


def test_draft_structure():
    assert TREE.depths == [0, 0, 1, 1, 1, 2]
    assert TREE.depth == 3 and not TREE.is_chain
    assert TREE.children(-1) == [0, 1] and TREE.children(0) == [2, 3]
    assert TREE.path_to(5) == [0, 3, 5]
    assert TREE.leaves() == [2, 4, 5]
    anc = TREE.ancestors_mask()
    assert anc[5].nonzero().flatten().tolist() == [0, 3, 5]
    chain = Draft.chain([4, 5, 6])
    assert chain.is_chain and chain.parents == [-1, 0, 1] and chain.depth == 3
    cut = TREE.truncated(2)
    assert cut.tokens.tolist() == [10, 11, 12, 13, 14] and cut.parents == [-1, -1, 0, 0, 1]
    assert len(Draft.empty()) == 0 and Draft.empty().depth == 0


def test_draft_rejects_bad_parents():
    with pytest.raises(ValueError, match="parent"):
        Draft(torch.tensor([1, 2]), [-1, 1])
    with pytest.raises(ValueError, match="parents"):
        Draft(torch.tensor([1, 2]), [-1])


@pytest.mark.parametrize("first_call", [True, False])
def test_tree_scoring_equals_per_path_scoring(first_call):
    model = tiny_llama(3, dtype=torch.float32)
    target = Target(model)
    committed = [3, 7, 9, 2, 5]
    if not first_call:  # the cache already holds a prefix: score feeds only the last token
        target.score(committed[:-1], Draft.empty())
        target.commit([])
    logits = target.score(committed, TREE).logits
    for leaf in TREE.leaves():
        path = TREE.path_to(leaf)
        ids = torch.tensor([committed + TREE.tokens[path].tolist()])
        with torch.no_grad():
            ref = model(ids).logits[0, len(committed) - 1 :]
        rows = [0] + [i + 1 for i in path]
        torch.testing.assert_close(logits[rows], ref, atol=1e-5, rtol=1e-5)


def _kv(target):
    return [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers]


@pytest.mark.parametrize("path", [[], [0], [0, 3], [0, 3, 5], [1, 4], [1]])
def test_commit_leaves_cache_equal_to_fresh_prefill(path):
    model = tiny_llama(4, dtype=torch.float32)
    committed = [3, 7, 9, 2, 5]
    target = Target(model)
    target.score(committed, TREE)
    target.commit(path)
    accepted = committed + TREE.tokens[path].tolist()
    assert target.cached_tokens == accepted
    fresh = Target(model)
    fresh.score(accepted, Draft.empty())
    for (k, v), (k2, v2) in zip(_kv(target), _kv(fresh)):
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-5)


def test_chain_commit_crops_rejected_tail():
    model = tiny_llama(5, dtype=torch.float32)
    target = Target(model)
    target.score([1, 2, 3], Draft.chain([4, 5, 6]))
    target.commit([0])
    assert target.cached_tokens == [1, 2, 3, 4]
    assert target.cache.get_seq_length() == 4


class HiddenRecorder(Drafter):
    """Asks for the target's hidden states and drafts the target's own greedy tokens."""

    needs_target_hidden = True

    def __init__(self, continuation):
        self.continuation, self.seen = continuation, []

    def propose(self, state):
        if state.target_hidden is not None:
            self.seen.append(state.target_hidden)
        done = len(state.tokens) - state.prompt_len
        return Draft.chain(self.continuation[done : done + 3])


def test_drafters_get_target_hidden_states_of_committed_positions():
    model = tiny_llama(6, dtype=torch.float32, sharpness=3.0)
    prompt = [3, 9, 4, 7]
    continuation = hf_greedy(model, prompt, 20)
    recorder = HiddenRecorder(continuation)
    SpeculativeDecoder(Target(model), recorder).generate(prompt, max_new_tokens=20, eos_token_ids=[])
    rows = torch.cat(recorder.seen)  # one row per committed position, in order
    with torch.no_grad():
        full = model(torch.tensor([prompt + continuation]), output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(rows, full[: len(rows)], atol=1e-5, rtol=1e-5)
    assert len(rows) > len(prompt) + 10
