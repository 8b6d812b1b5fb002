"""Medusa heads (`drafters/medusa/`) and typical acceptance (`verifiers/typical.py`).

Greedy identity (chain and tree x greedy, rejection at T = 0) and chi-square exactness of
medusa x rejection run with the other drafters in test_greedy_identity.py and
test_sampling_exact.py (tests/drafts.py line-up). Here: typical acceptance on hand-made
distributions and equal to greedy decoding at temperature 0; training end to end on a tiny
model; the artefact reloads, drafts losslessly, and refuses another target or corrupt files."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file

import spec_zoo.drafters.medusa.drafter as medusa_module
from spec_zoo import Draft, SamplingParams, SpeculativeDecoder, Target
from spec_zoo.api import generate
from spec_zoo.drafters.medusa.drafter import MedusaDrafter
from spec_zoo.drafters.medusa.heads import MedusaHeads, load_medusa
from spec_zoo.drafters.medusa.train import train_medusa
from spec_zoo.errors import ConfigError
from spec_zoo.trees import Static
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.typical import TypicalVerifier, thresholds
from tests.drafts import MEDUSA_TREE, medusa_heads
from tests.heads import check_corrupt_files_fail, teacher, train_cfg
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

PROMPT = [5, 9, 12, 5, 9, 12, 7, 3]
T1 = SamplingParams(temperature=1.0)


# -- typical acceptance on hand-made distributions -------------------------------------------


def _logits(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


def test_threshold_is_the_formula():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    entropy = -sum(x * math.log(x) for x in p.tolist())
    assert float(thresholds(p, 0.2, 0.5)) == pytest.approx(min(0.2, 0.5 * math.exp(-entropy)))
    assert float(thresholds(p, 0.01, 0.5)) == pytest.approx(0.01)  # epsilon caps it
    assert float(thresholds(torch.tensor([1.0, 0.0]), 0.3, 0.5)) == pytest.approx(0.3)  # one-hot: min(eps, delta)


def test_accepts_and_rejects_exactly_where_the_formula_says():
    # root p: threshold = min(0.2, 0.5 exp(-H)) = 0.5 * exp(-1.1289) = 0.1617
    root = [0.5, 0.3, 0.15, 0.05]
    limit = float(thresholds(torch.tensor(root, dtype=torch.float64), 0.2, 0.5))
    assert 0.15 < limit < 0.3
    verifier = TypicalVerifier(epsilon=0.2, delta=0.5)
    flat = [0.25, 0.25, 0.25, 0.25]  # H = log 4: limit = min(0.2, 0.125) = 0.125: every token passes
    for token, accepted in [(0, True), (1, True), (2, False), (3, False)]:
        v = verifier.verify(Draft.chain([token, 1]), _logits(root, flat, [0.1, 0.2, 0.6, 0.1]), T1, None)
        assert v.path == ([0, 1] if accepted else [])
        assert v.next_token == (2 if accepted else 0)  # the target's argmax after the path
        assert v.bonus == accepted
    # each token is judged against its own parent's row: a peaked one (limit 0.2) rejects p = 0.02
    peaked = [0.94, 0.02, 0.02, 0.02]
    v = verifier.verify(Draft.chain([1, 1]), _logits(root, peaked, flat), T1, None)
    assert v.path == [0] and v.next_token == 0 and not v.bonus


def test_tree_takes_the_longest_accepted_path_then_the_most_likely():
    root, flat = [0.5, 0.3, 0.15, 0.05], [0.25] * 4
    # nodes: 0:[tok 0] 1:[tok 1] 2:[0 -> tok 3] 3:[1 -> tok 2] 4:[1 -> tok 0]
    draft = Draft(torch.tensor([0, 1, 3, 2, 0]), [-1, -1, 0, 1, 1])
    rows = [root, flat, flat, [0.05, 0.05, 0.1, 0.8], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]
    v = TypicalVerifier(0.2, 0.5).verify(draft, _logits(*rows), T1, None)
    # depth 2 is reachable through node 2 (p = 0.25 under flat) and nodes 3, 4 (p = 0.25): node 0
    # has the higher first-token p (0.5 vs 0.3), so path [0, 2]
    assert v.path == [0, 2] and v.next_token == 3 and v.bonus


def test_at_temperature_zero_typical_is_greedy_match():
    draft = Draft(torch.tensor([0, 1, 3, 2]), [-1, -1, 0, 1])
    gen = torch.Generator().manual_seed(0)
    for seed in range(30):
        logits = torch.randn(5, 4, generator=gen)
        for eps in (0.5, 0.09, 1e-6):
            a = TypicalVerifier(eps, 0.3).verify(draft, logits, SamplingParams(), None)
            b = GreedyVerifier().verify(draft, logits, SamplingParams(), None)
            assert (a.path, a.next_token, a.bonus) == (b.path, b.next_token, b.bonus), seed


@pytest.mark.parametrize("epsilon", [0.09, 1e-3, 1e-6])
@pytest.mark.parametrize("tree", [None, MEDUSA_TREE])
def test_typical_decoding_equals_greedy_decoding_at_temperature_zero(epsilon, tree):
    model = tiny_llama(3, sharpness=3.0)
    drafter = MedusaDrafter(medusa_heads(model), tree=tree and Static(tree))
    out = SpeculativeDecoder(Target(model), drafter, TypicalVerifier(epsilon, 0.3)).generate(
        PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30) and out.stats.drafted > 0


def test_typical_is_lossy_and_strict_thresholds_give_greedy_text_when_sampling():
    assert TypicalVerifier.lossless is False
    model = tiny_llama(3, sharpness=3.0)
    # thresholds only the target's argmax can pass: only its argmax is ever committed
    strict = SpeculativeDecoder(Target(model), MedusaDrafter(medusa_heads(model), num_draft=3),
                                TypicalVerifier(0.999999, 1e6), sampling=T1)
    out = strict.generate(PROMPT, max_new_tokens=20, eos_token_ids=[], seed=0)
    assert out.ids == hf_greedy(model, PROMPT, 20) and out.stats.drafted > 0
    with pytest.raises(ConfigError, match="verifier.epsilon=1.5"):
        TypicalVerifier(epsilon=1.5)
    with pytest.raises(ConfigError, match="verifier.delta=0"):
        TypicalVerifier(delta=0)


# -- the drafter ---------------------------------------------------------------------------


def test_chain_and_tree_drafts_come_from_the_heads_on_the_last_target_state():
    model = tiny_llama(4, sharpness=3.0)
    heads = medusa_heads(model)
    seen = []

    class Spy(MedusaDrafter):
        def propose(self, state):
            draft = super().propose(state)
            seen.append((None if state.target_hidden is None else state.target_hidden[-1], draft))
            return draft

    for tree in (None, MEDUSA_TREE):
        seen.clear()
        SpeculativeDecoder(Target(model), Spy(heads, tree=tree and Static(tree))).generate(PROMPT, max_new_tokens=12,
                                                                                 eos_token_ids=[])
        assert seen[0][0] is None and len(seen[0][1]) == 0  # the first step drafts nothing
        for state, draft in seen[1:]:
            logits = heads(state)  # [K, V_draft]
            top = heads.vocab_ids[logits.topk(2, dim=-1).indices]  # [K, 2]
            if tree is None:
                assert draft.tokens.tolist() == top[: len(draft), 0].tolist() and draft.is_chain
            else:
                paths = sorted((tuple(p) for p in MEDUSA_TREE if len(p) <= draft.depth), key=lambda p: (len(p), p))
                assert len(draft) == len(paths) and draft.probs is None  # (cut near the token budget)
                for node, path in enumerate(paths):
                    assert int(draft.tokens[node]) == int(top[len(path) - 1, path[-1]])
                    assert draft.depths[node] == len(path) - 1


def test_sampled_chain_records_each_heads_distribution():
    model = tiny_llama(4, vocab=16, sharpness=3.0)
    heads = medusa_heads(model)
    drafter = MedusaDrafter(heads, num_draft=3)
    sampling = SamplingParams(temperature=0.7, top_k=5)
    decoder = SpeculativeDecoder(Target(model), drafter, sampling=sampling)
    drafts = []
    original = drafter.propose
    drafter.propose = lambda state: drafts.append((state.target_hidden, original(state))) or drafts[-1][1]
    decoder.generate(PROMPT, max_new_tokens=10, eos_token_ids=[], seed=3)
    hidden, draft = drafts[1]
    from spec_zoo.sampling import logits_to_probs, to_full_vocab

    q = logits_to_probs(to_full_vocab(heads(hidden[-1]), heads.vocab_ids, 16), sampling)
    assert torch.allclose(draft.probs, q[: len(draft)])
    assert (draft.probs[:, heads.vocab_ids.numel():] == 0).all()  # q = 0 outside the draft vocabulary


def test_bad_drafter_settings_fail_clearly():
    model = tiny_llama(4)
    heads = medusa_heads(model)
    with pytest.raises(ConfigError, match=r"\[1, 0\] needs \[1\] too"):
        MedusaDrafter(heads, tree={"policy": "static", "choices": [[0], [1, 0]]})
    deep = Static([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]])
    for drafter, message in [(MedusaDrafter(heads, num_draft=5),
                              "drafter.num_draft=5 but the Medusa heads have 4 heads"),
                             (MedusaDrafter(heads, tree=deep),
                              "drafter.tree has paths 5 deep but the Medusa heads have 4")]:
        with pytest.raises(ConfigError, match=message):
            SpeculativeDecoder(Target(model), drafter)
    with pytest.raises(ConfigError, match="drafter.num_draft=0"):
        MedusaDrafter(heads, num_draft=0)
    with pytest.raises(ConfigError, match="heads.num_heads=0"):
        MedusaHeads(model, 0)


def test_missing_shipped_heads_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(medusa_module, "SHIPPED", tmp_path / "nothing")
    with pytest.raises(ConfigError, match="shipped Medusa heads are missing.*drafter.heads=DIR"):
        MedusaDrafter()


# -- training end to end, artefact, refusals ------------------------------------------------


def _cfg(tmp_path, *overrides):
    return train_cfg("train_medusa", tmp_path, "heads.vocab_size=48", "heads.num_heads=3", *overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("medusa")
    model = teacher()
    return model, train_medusa(_cfg(tmp), target=Target(model)), tmp


def test_training_lowers_loss_and_raises_acceptance(trained):
    _, path, _ = trained
    record = json.loads((path / "medusa.json").read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"]
    assert after["tau_chain"] > before["tau_chain"]
    assert after["head2_greedy"] > before["head2_greedy"]
    assert record["num_heads"] == 3 and record["draft_vocab_size"] == 48 and record["steps"] == 40
    assert record["target"]["vocab_size"] == 64 and record["target"]["fingerprint"]
    assert sorted(p.name for p in path.iterdir()) == ["medusa.json", "medusa.safetensors"]  # safetensors only


@pytest.mark.parametrize("tree", [None, {"policy": "static", "choices": [[0], [1], [0, 0], [1, 0], [0, 0, 0]]}])
def test_trained_heads_load_back_and_draft_losslessly(trained, tree):
    model, path, _ = trained
    out = SpeculativeDecoder(Target(model), MedusaDrafter(str(path), tree=tree)).generate(
        PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30)
    assert out.stats.accepted > 0
    heads = load_medusa(path, model)
    assert not any(p.requires_grad for p in heads.parameters()) and heads.num_heads == 3


def test_the_cost_model_tree_is_capped_at_one_level_per_head_and_lossless(trained):
    """``tree=auto`` may plan deeper trees than there are heads: the drafter caps them."""
    model, path, _ = trained
    drafter = MedusaDrafter(str(path), tree={"policy": "auto", "max_depth": 6, "scoring_cost": 0.0})
    out = SpeculativeDecoder(Target(model), drafter).generate(PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30)
    assert 0 < max(step.depth for step in out.stats.steps) <= 3


def test_same_seed_same_heads_resume_and_soft_labels(trained, tmp_path):
    model = trained[0]
    a, a2 = (train_medusa(_cfg(tmp_path / name, "train.steps=12"), target=Target(model)) for name in ("a", "a2"))
    sa, sa2 = load_file(a / "medusa.safetensors"), load_file(a2 / "medusa.safetensors")
    assert all(torch.equal(sa[k], sa2[k]) for k in sa)
    b1 = train_medusa(_cfg(tmp_path / "b", "train.steps=8", "train.keep_checkpoints=true", "train.ckpt_every=4"),
                      target=Target(model))
    assert (b1.parent / f".{b1.name}.checkpoints" / "last.safetensors").is_file()
    b = train_medusa(_cfg(tmp_path / "b", "train.steps=8", "train.keep_checkpoints=true", "train.ckpt_every=4"),
                     target=Target(model))  # the same command again: resumes at the checkpoint of step 4
    record = json.loads((b / "medusa.json").read_text())
    assert record["steps"] == 8 and record["history"][0]["step"] == 8
    soft = train_medusa(_cfg(tmp_path / "soft", "heads.labels=distributions", "train.steps=10"), target=Target(model))
    record = json.loads((soft / "medusa.json").read_text())
    assert record["config"]["heads"]["labels"] == "distributions"
    assert record["heldout_after"]["loss"] < record["heldout_before"]["loss"]


def test_refuses_heads_for_another_target(trained):
    _, path, _ = trained
    with pytest.raises(ConfigError, match="drafter.heads=.*trained for target.*embedding weights differ"):
        load_medusa(path, teacher(seed=4))
    with pytest.raises(ConfigError, match="trained for target"):
        SpeculativeDecoder(Target(teacher(seed=4)), MedusaDrafter(str(path)))


def test_corrupt_heads_files_fail_clearly(trained, tmp_path):
    model, path, _ = trained
    # weights with trained LM-head rows, recorded as heads that share the target's: they do not fit
    check_corrupt_files_fail(load_medusa, path, tmp_path / "bad", MedusaHeads,
                             MedusaHeads(model, 3, vocab_ids=torch.arange(48), train_head=True), model)


def test_bad_training_config_fails_before_any_model_load(tmp_path, monkeypatch):
    import spec_zoo.train.loop as loop

    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    for override, message in [("heads.num_heads=0", "heads.num_heads=0"), ("heads.labels=soft", "heads.labels='soft'"),
                              ("heads.decay=0", "heads.decay=0"), ("heads.vocab_size=-2", "heads.vocab_size=-2")]:
        with pytest.raises(ConfigError, match=message):
            train_medusa(_cfg(tmp_path, override))


def test_config_builds_the_medusa_drafter_and_the_typical_verifier(trained):
    """``drafter=medusa drafter.heads=DIR verifier=typical`` from the Hydra config, as the CLI builds it."""
    model, path, _ = trained
    out = generate(PROMPT, drafter="medusa", verifier="typical", model=Target(model), max_new_tokens=12,
                   heads=str(path))
    assert out.ids == hf_greedy(model, PROMPT, 12, eos=1)[: len(out.ids)] and out.stats.drafted > 0


def test_the_lossy_rule_is_labelled_in_the_summary_line_the_list_and_bench_records():
    from omegaconf import OmegaConf

    from spec_zoo.api import label
    from spec_zoo.bench.methods import SpecZooMethod
    from spec_zoo.bench.records import method_label
    from spec_zoo.bench.runner import _lossless
    from spec_zoo.registry import format_options, options

    model = tiny_llama(3)
    decoder = SpeculativeDecoder(Target(model), MedusaDrafter(medusa_heads(model)), TypicalVerifier())
    assert "verifier=typical (LOSSY" in label(OmegaConf.create({"drafter": {}}), decoder, None)
    listed = {(o.group, o.name): o.lossless for o in options()}
    assert listed[("verifier", "typical")] is False and listed[("method", "medusa_typical")] is False
    assert listed[("method", "medusa")] is True and listed[("method", "medusa_tree")] is True
    assert re.search(r"\n  typical\s+LOSSY ", format_options(options()))
    assert _lossless(SpecZooMethod("m", decoder, {}, "h")) is False
    assert method_label({"method": "medusa_typical", "lossless": False}) == "medusa_typical (LOSSY)"
    assert method_label({"method": "medusa", "lossless": True}) == "medusa"


# -- the heads shipped for SmolLM2-135M ----------------------------------------------------


def test_shipped_heads_refuse_another_target():
    record = json.loads((medusa_module.SHIPPED / "medusa.json").read_text())
    assert record["target"]["name"] == "smollm2-135m" and record["num_heads"] == 4
    with pytest.raises(ConfigError, match="trained for target 'smollm2-135m'"):
        load_medusa(medusa_module.SHIPPED, tiny_llama(0, layers=12))


@pytest.mark.real_model
def test_shipped_heads_are_lossless_and_beat_their_initialisation_on_the_real_target(smollm2_target):
    plain = SpeculativeDecoder(smollm2_target)
    shipped = load_medusa(medusa_module.SHIPPED, smollm2_target.model)
    untrained = MedusaHeads(smollm2_target.model, 4, vocab_ids=shipped.vocab_ids).eval()  # all guess the next token
    prompts = [plain.encode("What is 12 times 7? Explain step by step.")]
    expected = [plain.generate(prompt, max_new_tokens=32).ids for prompt in prompts]
    accepted = {}
    for name, heads in (("shipped", shipped), ("untrained", untrained)):
        decoder = SpeculativeDecoder(smollm2_target, MedusaDrafter(heads))
        outs = [decoder.generate(prompt, max_new_tokens=32) for prompt in prompts]
        assert [out.ids for out in outs] == expected
        accepted[name] = sum(out.stats.accepted for out in outs)
    assert accepted["shipped"] > max(3, 2 * accepted["untrained"])  # training taught the heads to look ahead
