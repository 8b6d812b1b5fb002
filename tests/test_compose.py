"""Composed drafters: ``drafter=cascade`` and ``drafter=merge``.

Greedy identity and exactness (enumerated) run in the shared line-ups (tests/drafts.py adds
cascades and merges to `drafter_lineup`, so tests/test_greedy_identity.py and
tests/test_sampling_exact.py cover them). Here: the q of a merged tree (one verification
step, enumerated), what members see, the cascade's own rule, YAML composition, bad input.
"""

from __future__ import annotations

import time

import pytest
import torch

from spec_zoo import Draft, Drafter, SamplingParams, SpeculativeDecoder, Target
from spec_zoo.api import build_decoder, compose_config
from spec_zoo.certify import explore, total_variation
from spec_zoo.costs import CostTable
from spec_zoo.draft import ROOT
from spec_zoo.drafters.cascade import CascadeDrafter
from spec_zoo.drafters.composed import member_verdict
from spec_zoo.drafters.merge import MergeDrafter, merge_drafts
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.sampling import sample
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import drafter_lineup
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)


class Fixed(Drafter):
    """Proposes the same chain every step; records what it is told."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens, self.asked, self.begun, self.commits = list(tokens), 0, 0, []

    def begin(self, state):
        self.begun += 1

    def propose(self, state):
        self.asked += 1
        return Draft.chain(self.tokens[: state.max_depth])

    def on_commit(self, draft, verdict, step):
        self.commits.append((draft.tokens.tolist(), verdict))


# -- the merged tree and its q -----------------------------------------------------------
def test_deterministic_drafts_share_prefixes():
    tree = merge_drafts([Draft.chain([5, 6, 7]), Draft.chain([5, 6, 9]), Draft.chain([8])])
    assert tree.tokens.tolist() == [5, 6, 7, 9, 8]
    assert tree.parents == [ROOT, 0, 1, 1, ROOT] and tree.probs is None


def test_sampled_drafts_stay_separate_subtrees_with_their_q():
    qa, qb = torch.full((2, 4), 0.25), torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    tree = merge_drafts([Draft.chain([1, 2], qa), Draft.chain([1], qb), Draft.chain([1, 3])])
    # the sampled 1s are not shared; the deterministic chain gets one-hot rows
    assert tree.tokens.tolist() == [1, 2, 1, 1, 3] and tree.parents == [ROOT, 0, ROOT, ROOT, 3]
    assert torch.equal(tree.probs[:2], qa) and torch.equal(tree.probs[2], qb[0])
    assert tree.probs[3].tolist() == [0, 1, 0, 0] and tree.probs[4].tolist() == [0, 0, 0, 1]


def _share_sampled_too(drafts):
    """The rule merge refuses: sampled drafts merged like deterministic ones (first q kept)."""
    if drafts[0].tokens[0] == drafts[1].tokens[0]:
        return drafts[0]
    return merge_drafts(drafts)


@pytest.mark.parametrize("merge, exact", [(merge_drafts, True), (_share_sampled_too, False)])
def test_first_token_of_a_merged_sampled_tree_follows_p(merge, exact):
    """One verification step over two independently sampled drafts, often equal: the
    committed token follows p with merge's rule, and not when the equal drafts are shared."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float64)
    logits = p.log()[None].expand(3, -1)
    verifier, sampling = RejectionVerifier(), SamplingParams(temperature=1.0)

    def first_token():
        a, b = sample(q.expand(2, -1), None).tolist()
        tree = merge([Draft.chain([a], q[None]), Draft.chain([b], q[None])])
        verdict = verifier.verify(tree, logits[: len(tree) + 1], sampling, None)
        return int(tree.tokens[verdict.path[0]]) if verdict.path else verdict.next_token

    law: dict = {}
    for token, prob in explore(first_token):  # every draw and coin, enumerated
        law[token] = law.get(token, 0.0) + prob
    tv = total_variation(law, dict(enumerate(p.tolist())))
    assert tv <= 1e-9 if exact else tv >= 1e-3


def test_a_member_is_told_its_own_part_of_the_verdict():
    own = Draft.chain([4, 5, 6])
    assert member_verdict(own, [4, 5, 9], accepted=2).path == [0, 1]
    told = member_verdict(own, [4, 5, 9], accepted=2)
    assert told.next_token == 9 and not told.bonus
    other = member_verdict(own, [7, 8], accepted=1)  # another member's token was accepted
    assert other.path == [] and other.next_token == 7 and not other.bonus
    idle = member_verdict(Draft.empty(), [7, 8], accepted=1)
    assert idle.path == [] and idle.next_token == 7 and idle.bonus


# -- what members see ----------------------------------------------------------------------
def test_every_member_sees_begin_and_every_commit():
    model = tiny_llama(3, sharpness=3.0)
    first, second = Fixed([9, 9]), Fixed([8])
    decoder = SpeculativeDecoder(Target(model), CascadeDrafter([first, second], min_speedup=0))
    out = decoder.generate([5, 6, 7], max_new_tokens=12, eos_token_ids=[])
    steps = out.stats.target_forwards
    assert first.begun == second.begun == 1
    assert len(first.commits) == len(second.commits) == steps
    assert second.asked == 0  # the first always proposes
    # the idle member hears an empty draft and the first token committed each step
    for mine, verdict in second.commits:
        assert mine == [] and verdict.path == []
    assert second.commits[0][1].next_token == out.ids[0]


def test_cascade_uses_the_next_member_when_the_first_finds_nothing():
    model = tiny_llama(4, sharpness=3.0)
    cascade = drafter_lineup(model)["cascade_ngram_small"]()
    decoder = SpeculativeDecoder(Target(model), cascade)
    chosen = set()
    run = decoder.steps([5, 6, 7, 8, 9, 5, 6, 7], max_new_tokens=30, eos_token_ids=[])
    for _ in run:
        chosen.add(cascade._chosen)
    assert {0, 1} <= chosen  # the lookup drafted some steps, the small model others


def test_cascade_skips_a_member_that_does_not_pay_then_retries_it():
    model = tiny_llama(5, sharpness=3.0)
    bad = Fixed([63] * 4)  # a token this target (almost) never picks
    helper = NgramDrafter(num_draft=2, adaptive=False)
    decoder = SpeculativeDecoder(Target(model), CascadeDrafter([bad, helper]))
    out = decoder.generate([5, 6, 7, 5, 6, 7, 5, 6], max_new_tokens=60, eos_token_ids=[])
    steps = out.stats.target_forwards
    assert 2 <= bad.asked < steps / 2  # skipped most steps, but asked again after fading
    assert out.stats.accepted > 0  # the lookup drafted in its place


class CountedLookup(NgramDrafter):
    """Prompt lookup that counts the steps it was asked to draft."""

    asked = 0

    def propose(self, state):
        self.asked += 1
        return super().propose(state)


def test_the_cascade_prices_members_at_their_measured_draft_cost_in_sampled_runs():
    """A member's drafting cost measured into the cost table (``spec-zoo costs drafter=ngram``)
    prices its steps in a sampled run (stored data, not the clock, which steers greedy runs
    only): measured cheap, the lookup drafts in most steps; measured dear, it falls below
    ``min_speedup`` and is skipped. The same table gives the same text for the same seed."""
    model = tiny_llama(5, sharpness=3.0)
    prompt, asked, texts = [5, 6, 7, 8] * 6, {}, {}
    for cost in (0.01, 0.9, 0.9):
        table = CostTable([1e-3] * 8, "tiny", "eager", "float32", 1, "test", drafts={"ngram": cost})
        lookup = CountedLookup(num_draft=2, adaptive=False)
        decoder = SpeculativeDecoder(Target(model), CascadeDrafter([lookup, Fixed([])], min_speedup=1.2),
                                     sampling=SamplingParams(temperature=1.0), cost_table=table)
        out = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[], seed=3)
        asked[cost] = lookup.asked / out.stats.target_forwards
        texts.setdefault(cost, []).append(out.ids)
    assert asked[0.01] > 0.5 and asked[0.9] < 0.1
    assert texts[0.9][0] == texts[0.9][1]


class SlowLookup(NgramDrafter):
    """Prompt lookup that takes 30 ms to draft: accepted often, yet dear on this machine."""

    asked = 0

    def propose(self, state):
        self.asked += 1
        time.sleep(0.03)
        return super().propose(state)


@pytest.mark.parametrize("table", [False, True])
def test_greedy_cascade_prices_members_by_their_measured_time_when_a_cost_table_exists(table):
    """By counts, a lookup accepted on this repetitive prompt pays, so it drafts every step;
    in a greedy run with a cost table its measured steps (30 ms of drafting against a ~ms
    target step) price it below 1 and it is skipped most steps. The text is the same."""
    model = tiny_llama(5, sharpness=3.0)
    target, slow = Target(model), SlowLookup(num_draft=2, adaptive=False)
    costs = CostTable([1e-3] * 8, "tiny", "eager", "float32", 1, "test") if table else None
    decoder = SpeculativeDecoder(target, CascadeDrafter([slow, Fixed([])]), cost_table=costs)
    prompt = [5, 6, 7, 8] * 6
    out = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[])
    steps = out.stats.target_forwards
    if table:
        assert slow.asked < steps / 2
    else:
        assert slow.asked >= steps - 1
    plain = SpeculativeDecoder(Target(model), Fixed([])).generate(prompt, max_new_tokens=40, eos_token_ids=[])
    assert out.ids == plain.ids


def test_cascade_with_sampled_members_is_reproducible():
    model = tiny_llama(6, sharpness=3.0)
    lineup = drafter_lineup(model, sampled=True)
    runs = []
    for seed in (3, 3, 4):
        decoder = SpeculativeDecoder(Target(model), lineup["cascade_ngram_eagle"](),
                                     sampling=SamplingParams(temperature=1.0))
        runs.append(decoder.generate([5, 6, 7, 5, 6, 7], max_new_tokens=20, eos_token_ids=[], seed=seed).ids)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_needs_target_hidden_is_forwarded():
    model = tiny_llama(0)
    lineup = drafter_lineup(model)
    assert lineup["cascade_ngram_eagle"]().needs_target_hidden
    assert not lineup["cascade_ngram_small"]().needs_target_hidden
    assert MergeDrafter([NgramDrafter(), lineup["eagle_k3"]()]).needs_target_hidden


# -- YAML ----------------------------------------------------------------------------------
def test_members_compose_from_their_yaml_with_overrides():
    cfg = compose_config(["drafter=cascade", "drafter.members=[ngram,none]", "+drafter.params.ngram.num_draft=7",
                          "+drafter.costs.ngram=0.05"])
    from spec_zoo.registry import build_component

    cascade = build_component(cfg.drafter, "drafter")
    assert cascade.labels == ["ngram", "none"] and cascade.members[0].length.initial == 7
    assert cascade.costs == [0.05, 0.1]
    merge = build_component(compose_config(["drafter=merge", "drafter.members=[ngram,cascade]"]).drafter, "drafter")
    assert type(merge.members[1]) is CascadeDrafter and merge.members[1].labels == ["ngram", "eagle"]


def test_bench_methods_resolve():
    from spec_zoo.bench.specs import resolve_methods

    specs, _ = resolve_methods(["cascade", "cascade_distilled", "merge"], [])
    members = {s.name: s.drafter["members"] for s in specs if s.name != "ar"}
    assert members == {"cascade": ["ngram", "eagle"], "cascade_distilled": ["ngram", "distilled"],
                       "merge": ["ngram", "eagle"]}


# -- bad input: a ConfigError naming the key, before any model loads -----------------------
def rejects(*overrides, match):
    cfg = compose_config(list(overrides))
    with pytest.raises(ConfigError, match=match) as info:
        build_decoder(cfg)
    return str(info.value)


@pytest.mark.parametrize("overrides, match", [
    (["drafter=cascade", "drafter.members=[ngram,cascade]"], r"members\[1\]=cascade: a cascade cannot contain"),
    (["drafter=merge", "drafter.members=[merge]"], r"members\[0\]=merge: a merge cannot contain"),
    (["drafter=cascade", "drafter.members=[ngram,merge]", "+drafter.params.merge.members=[cascade]"],
     r"cascade -> merge -> cascade"),
    (["drafter=cascade", "drafter.members=[ngram,ngarm]"], r"members\[1\]=ngarm is unknown.*eagle"),
    (["drafter=merge", "drafter.members=[]"], r"drafter.members=\[\]: a merge needs a non-empty list"),
    (["drafter=cascade", "+drafter.params.eagel.num_draft=2"], r"drafter.params has overrides for \['eagel'\]"),
    (["drafter=cascade", "+drafter.params.ngram.num_draft=0"], r"members\[0\]=ngram: drafter.num_draft=0"),
    (["drafter=cascade", "+drafter.costs.eagle=1.5"], r"drafter.costs.eagle=1.5"),
    (["drafter=merge", "drafter.members=[ngram,{_target_:nowhere.Drafter}]"], r"members\[1\]=nowhere.Drafter"),
])
def test_bad_members_fail_before_any_model_loads(no_model_load, monkeypatch, overrides, match):
    def no_draft_model(*_, **__):
        raise AssertionError("a member was built before the bad input was rejected")

    monkeypatch.setattr("spec_zoo.drafters.eagle.drafter.EagleDrafter.__init__", no_draft_model)
    rejects(*overrides, match=match)


def test_member_vocabulary_must_match_the_target():
    target = Target(tiny_llama(0, vocab=64))
    other = SmallModelDrafter(tiny_llama(1, vocab=32), num_draft=2)
    with pytest.raises(ConfigError, match=r"members\[1\]=small_model: .*vocabulary of 32"):
        SpeculativeDecoder(target, MergeDrafter([NgramDrafter(), other]))


def test_a_member_drafting_outside_the_vocabulary_is_named():
    target = Target(tiny_llama(0, vocab=64))
    decoder = SpeculativeDecoder(target, CascadeDrafter([Fixed([70, 71])]))
    with pytest.raises(ConfigError, match=r"members\[0\]=fixed drafts over a vocabulary"):
        decoder.generate([5, 6, 7], max_new_tokens=4, eos_token_ids=[])

