"""The adaptive draft-length rule: longer after full acceptance, shorter after
rejections, and no drafting at all once drafting stops paying for itself."""

import pytest
import torch

from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError


def test_fixed_length_never_moves():
    length = DraftLength(4, adaptive=False, maximum=16)
    for _ in range(5):
        length.update(4, 0)
    assert length.choose() == 4


def test_grows_with_acceptance_and_shrinks_to_zero_with_rejection():
    length = DraftLength(4, adaptive=True, maximum=16, token_cost=0.1)
    assert length.choose() == 4  # no evidence yet: the configured start
    for _ in range(10):
        length.update(length.choose(), length.choose())
    grown = length.choose()
    assert grown > 4
    seen = []
    for _ in range(40):
        k = length.choose()
        seen.append(k)
        if k == 0:
            break
        length.update(k, 0)
    assert seen == sorted(seen, reverse=True) and seen[-1] == 0


def test_buckets_learn_separately():
    length = DraftLength(2, adaptive=True, maximum=8)
    for _ in range(10):
        length.update(2, 2, bucket="long match")
        length.update(2, 0, bucket="short match")
    assert length.choose("long match") > length.choose("short match")


def test_higher_cost_means_shorter_drafts():
    cheap, dear = DraftLength(4, True, 16, token_cost=0.02), DraftLength(4, True, 16, token_cost=0.4)
    for policy in (cheap, dear):
        for _ in range(5):
            policy.update(4, 2)
    assert cheap.choose() > dear.choose()


@pytest.mark.parametrize(
    "args, key",
    [((0, False, 4), "num_draft"), ((-3, True, 4), "num_draft"), ((8, True, 4), "max_draft"),
     ((4, True, 8, 1.5), "token_cost")],
)
def test_bad_values_name_the_key(args, key):
    with pytest.raises(ConfigError, match=key):
        DraftLength(*args)


def _feed(policy, cost, jump=0.0, steps=60, t0=0.05, lengths=(0, 1, 2, 4)):
    """Steps of varied draft length timed t0 (1 + jump [k > 0] + cost k); half the tokens accepted."""
    for i in range(steps):
        k = lengths[i % len(lengths)]
        policy.update(k, k // 2, seconds=t0 * (1 + jump * (k > 0) + cost * k))


@pytest.mark.parametrize("jump, cost", [(0.0, 0.02), (0.0, 0.1), (0.0, 0.4), (0.5, 0.05)])
def test_costs_are_learned_from_step_times(jump, cost):
    policy = DraftLength(4, adaptive=True, maximum=16, token_cost=0.1, learn_cost=True)
    _feed(policy, cost, jump)
    assert policy.costs() == pytest.approx((jump, cost), rel=1e-6, abs=1e-9)


def test_two_lengths_fit_a_line():
    policy = DraftLength(4, adaptive=True, maximum=16, token_cost=0.1)
    _feed(policy, 0.3, lengths=(0, 4))
    assert policy.costs() == pytest.approx((0.0, 0.3))


def test_a_big_jump_stops_drafting_at_low_acceptance():
    smooth, jumpy = DraftLength(4, True, 16, 0.1), DraftLength(4, True, 16, 0.1)
    _feed(smooth, 0.1)
    _feed(jumpy, 0.02, jump=0.6)
    for policy in (smooth, jumpy):
        for _ in range(4):
            policy.update(4, 0)
        policy.update(4, 1)
        assert 0.3 < policy.acceptance() < 0.5
    assert smooth.choose() >= 1 and jumpy.choose() == 0


def test_learned_cost_changes_the_draft_length_and_can_be_switched_off():
    cheap, dear, fixed = (DraftLength(4, True, 16, 0.1, learn) for learn in (True, True, False))
    _feed(cheap, 0.02)
    _feed(dear, 0.6)
    _feed(fixed, 0.6)
    assert fixed.costs() == (0.0, 0.1)
    assert cheap.choose() > fixed.choose() > dear.choose()


def test_cost_needs_varied_lengths_and_skips_the_prefill_step():
    policy = DraftLength(4, True, 16, token_cost=0.1)
    policy.update(4, 4, seconds=100.0)  # first step: prefill, ignored
    for _ in range(20):
        policy.update(4, 2, seconds=0.07)  # always k = 4: slope not identifiable
    assert policy.costs() == (0.0, 0.1)


def test_skipped_steps_let_drafting_resume():
    policy = DraftLength(4, adaptive=True, maximum=8, token_cost=0.1, learn_cost=False)
    while policy.choose() > 0:
        policy.update(policy.choose(), 0)
    for _ in range(60):
        if policy.choose() > 0:
            break
        policy.update(0, 0)
    assert policy.choose() > 0


def test_a_draft_model_is_not_run_while_no_draft_pays_and_takes_what_it_missed_when_one_does():
    """A draft model's forward is most of a draft's cost: when the length rule says 0 the step runs
    the target alone (issue 62: the 4-bit copy kept its cache in step every step, 0.53x plain), and
    the draft's cache later takes the tokens it missed in one forward. The draft here is the target
    itself, so every drafted token is accepted exactly when that cache is right."""
    import copy

    from spec_zoo import SpeculativeDecoder, Target
    from spec_zoo.drafters.small_model import SmallModelDrafter
    from tests.tiny import tiny_llama

    target = Target(tiny_llama(0, vocab=64))
    same = copy.deepcopy(target.model)
    fed = []
    same.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                   with_kwargs=True)
    drafter = SmallModelDrafter(same, num_draft=2, adaptive=True)
    lengths = iter([2, 0, 0, 0, 2, 0, 2] + [0] * 100)
    drafter.length.choose = lambda bucket=None, state=None: next(lengths)
    out = SpeculativeDecoder(target, drafter).generate([5, 6, 7], max_new_tokens=30, eos_token_ids=[])
    plain = target.model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=30, do_sample=False)[0, 3:]
    assert out.ids == plain.tolist()
    assert out.stats.drafted == out.stats.accepted == 6  # three drafts of 2, all held: the caught-up cache is right
    assert len(fed) == 3 * 2  # two forwards a draft (its first logits, then the next token's), none otherwise
    assert fed[2] > 3 and fed[4] > 1  # after skipped steps: every token the draft missed, in one forward


def test_with_no_cost_table_a_plain_step_times_t1_and_a_draft_dearer_than_it_pays_stops():
    """A good but dear draft (every token held, 1.05 t(1) a level: the 4-bit copy on the native target)
    stays at max_draft, so its lengths never vary and the fit alone would keep the prior cost. After
    PROBE_AFTER drafting steps one step drafts nothing: its time is t(1), the drafting seconds per level
    over it price the draft, and the dear one stops. A cheap draft is probed the same way and keeps on."""
    from spec_zoo.draft_length import PROBE_AFTER

    def run(level_cost: float) -> list[int]:
        policy, chosen = DraftLength(8, adaptive=True, maximum=8, token_cost=0.25), []
        for _ in range(100):
            k = policy.choose()
            chosen.append(k)
            policy.update(k, k, seconds=0.01 * (1 + level_cost * k), draft_seconds=0.01 * level_cost * k)
        return chosen

    dear, cheap = run(1.05), run(0.02)
    assert dear[:PROBE_AFTER + 1] == [8] * (PROBE_AFTER + 1)  # the first step (a prefill) is not timed
    assert set(dear[PROBE_AFTER + 1:]) == {0}  # a probe, then the cost seen: drafting stopped
    assert cheap.count(0) <= 6 and cheap[-1] == 8  # a probe now and then, drafting all along


def test_with_a_cost_table_the_drafting_time_seen_prices_a_draft_the_table_has_not_measured():
    """The table knows t(k) but not this draft: its drafting seconds per level over the table's t(1)
    price it once three drafting steps are seen (greedy runs), else token_cost; the table's own measure wins."""
    from spec_zoo import SamplingParams
    from spec_zoo.costs import CostTable
    from spec_zoo.interfaces import DecodeState

    flat = CostTable([0.01] * 8, "m", "compiled", "float32", 1, "x")
    measured = CostTable([0.01] * 8, "m", "compiled", "float32", 1, "x", drafts={"quantized": 0.02})
    greedy = DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=flat)
    policy = DraftLength(4, adaptive=True, maximum=8, token_cost=0.25)
    policy.cost_key = "quantized"
    for _ in range(4):
        policy.update(8, 8, seconds=0.1, draft_seconds=8 * 0.0105)  # 1.05 t(1) a level
    assert policy.draft_cost(flat) == pytest.approx(1.05) and policy.choose(state=greedy) == 0
    assert policy.draft_cost(flat, timings_steer=False) == 0.25 and policy.draft_cost(measured) == 0.02
    assert policy.choose(state=DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=measured)) > 0


def test_a_stored_measure_of_the_drafter_prices_its_first_draft_too():
    """With no evidence yet the length is num_draft, unless the cost table measured this drafter: then
    the first draft is priced at the prior acceptance (a draft the table says cannot pay never runs)."""
    from spec_zoo import SamplingParams
    from spec_zoo.costs import CostTable
    from spec_zoo.interfaces import DecodeState

    def first(drafts: dict) -> int:
        policy = DraftLength(6, adaptive=True, maximum=16, token_cost=0.25)
        policy.cost_key = "quantized"
        table = CostTable([0.01] * 8, "m", "compiled", "float32", 1, "x", drafts=drafts)
        return policy.choose(state=DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=table))

    assert first({}) == first({"ngram": 0.01}) == 6
    assert first({"quantized": 1.05}) == 0 and first({"quantized": 0.01}) > 0
