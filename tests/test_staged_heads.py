"""The MLP speculator (`drafters/mlp_speculator/`) and Hydra heads (`drafters/hydra/`): heads run
in sequence on the target's last state (`spec_zoo.staged`), each stage reading the token drafted
before it.

Greedy identity (chain, adaptive chain, static and top-k trees x greedy, rejection) runs with the
other drafters in test_greedy_identity.py (tests/drafts.py line-up), certified cells in
test_certify.py. Here, for each method: its drafts are the stages' own outputs along each path
(a drafter recording one q row per level, Medusa's shortcut, fails there), sampled chains and
trees certified exact under rejection, broken greedy and rejection rules caught, training end to end on a tiny
model, the artefact reloads and drafts losslessly, and bad settings fail clearly."""

from __future__ import annotations

import json

import pytest
import torch

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.api import generate
from spec_zoo.costs import CostTable
from spec_zoo.draft import ROOT
from spec_zoo.drafters.hydra.drafter import HydraDrafter
from spec_zoo.drafters.hydra.heads import HydraHeads
from spec_zoo.drafters.hydra.train import HydraRecipe
from spec_zoo.drafters.mlp_speculator.drafter import MLPSpeculatorDrafter
from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator
from spec_zoo.drafters.mlp_speculator.train import MLPSpeculatorRecipe
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.sampling import to_full_vocab
from spec_zoo.testing import CERTIFY_SETTINGS, assert_greedy_identity, assert_lossless
from spec_zoo.train.loop import train_module
from spec_zoo.trees import Static
from spec_zoo.verifiers.greedy import GreedyVerifier
from tests.drafts import staged_heads
from tests.heads import check_corrupt_files_fail, teacher, train_cfg
from tests.test_certify import SkipResidual
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

METHODS = {  # name -> (heads, drafter, recipe, the config section, its size key)
    "hydra": (HydraHeads, HydraDrafter, HydraRecipe, "heads", "num_heads"),
    "mlp_speculator": (MLPSpeculator, MLPSpeculatorDrafter, MLPSpeculatorRecipe, "speculator", "num_stages"),
}
PROMPT = [5, 9, 12, 5, 9, 12, 7, 3]
TREE = [[0], [1], [0, 0], [1, 0], [1, 1]]  # two depth-2 parents: their children must differ


def _path_logits(heads, hidden: torch.Tensor, tokens: list[int], vocab: int) -> torch.Tensor:
    """The last stage's full-vocabulary logits along one path (``tokens``: the last committed
    token, then the drafted ones before the guessed token), computed stage by stage."""
    state = heads.start(hidden[None])
    for stage, token in enumerate(tokens):
        state = heads.advance(stage, state, torch.tensor([token]))
    return to_full_vocab(heads.logits(len(tokens) - 1, state), heads.vocab_ids, vocab)[0]


@pytest.mark.parametrize("method", list(METHODS))
def test_each_node_is_its_stage_on_its_own_path(method):
    heads_cls, drafter_cls = METHODS[method][:2]
    model = tiny_llama(4, sharpness=3.0)
    heads = staged_heads(heads_cls, model)
    seen = []

    class Spy(drafter_cls):
        def propose(self, state):
            draft = super().propose(state)
            seen.append((state.target_hidden, state.tokens[-1], draft))  # (the token list grows later)
            return draft

    for tree in (None, TREE):
        seen.clear()
        sampling = SamplingParams() if tree is None else SamplingParams(temperature=1.0)
        SpeculativeDecoder(Target(model), Spy(heads, tree=tree and Static(tree)), sampling=sampling).generate(
            PROMPT, max_new_tokens=12, eos_token_ids=[], seed=1)
        assert len(seen[0][2]) == 0  # the first step drafts nothing
        for hidden, last, draft in seen[1:]:
            h = hidden[-1]
            for node in range(len(draft)):
                path = [last] + [int(draft.tokens[n]) for n in draft.path_to(node)[:-1]]
                logits = _path_logits(heads, h, path, 64)
                if tree is None:  # greedy chain: each stage's argmax given the tokens before it
                    assert int(draft.tokens[node]) == int(logits.argmax())
                else:  # sampled tree: the q recorded is the node's own stage on its own path
                    assert torch.allclose(draft.probs[node], torch.softmax(logits, -1), atol=1e-12)
            if tree is not None and draft.depth >= 2:  # the children of [0] and of [1]: rows of their own
                assert not torch.equal(draft.probs[draft.children(0)[0]], draft.probs[draft.children(1)[0]])


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("setting", list(CERTIFY_SETTINGS))
def test_sampled_chains_and_trees_are_certified_exact_with_rejection(method, setting):
    """Each certificate asserts exactness; random heads whose drafts the target never accepts
    (tau 1: possible under top-k/top-p, and which seed does it depends on the CPU's rounding at
    the nucleus's edge) would prove it only on rejecting paths, so the next seed is tried."""
    heads_cls, drafter_cls = METHODS[method][:2]
    for shape in ({"num_draft": 2}, {"tree": Static(TREE)}):
        for seed in (5, 6, 7):
            cert = assert_lossless(lambda m, kw=shape, seed=seed: drafter_cls(staged_heads(heads_cls, m, 2, seed),
                                                                                **kw),
                                   sampling=CERTIFY_SETTINGS[setting])
            if cert.tau > 1.0:
                break
        assert cert.tau > 1.0


class TopEightGreedy(GreedyVerifier):
    """A broken greedy rule: a draft token among the target's top eight is accepted."""

    def verify(self, draft, target_logits, sampling, generator):
        from spec_zoo.interfaces import Verdict

        path, node = [], ROOT
        while True:
            top8 = target_logits[node + 1].topk(8).indices.tolist()
            child = next((c for c in draft.children(node) if int(draft.tokens[c]) in top8), None)
            if child is None:
                return Verdict(path, top8[0], bonus=not draft.children(node))
            path.append(child)
            node = child


@pytest.mark.parametrize("method", list(METHODS))
def test_broken_rules_are_caught(method):
    heads_cls, drafter_cls = METHODS[method][:2]
    with pytest.raises(AssertionError, match="differs from plain greedy"):
        assert_greedy_identity(lambda m: drafter_cls(staged_heads(heads_cls, m), num_draft=3), seeds=(0,),
                               verifiers=[TopEightGreedy()])
    with pytest.raises(AssertionError, match="exact total variation"):
        assert_lossless(lambda m: drafter_cls(staged_heads(heads_cls, m, 2), num_draft=2), SkipResidual(),
                        CERTIFY_SETTINGS["t1"])


@pytest.mark.parametrize("method", list(METHODS))
def test_bad_settings_fail_clearly(method, tmp_path):
    heads_cls, drafter_cls, _, section, size = METHODS[method]
    model = tiny_llama(4)
    heads = staged_heads(heads_cls, model)
    for drafter, message in [(drafter_cls(heads, num_draft=4), "drafter.num_draft=4 but the .* have 3 stages"),
                             (drafter_cls(heads, tree=Static([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])),
                              "drafter.tree has paths 4 deep but the .* have 3 stages")]:
        with pytest.raises(ConfigError, match=message):
            SpeculativeDecoder(Target(model), drafter)
    with pytest.raises(ConfigError, match="drafter.num_draft=0"):
        drafter_cls(heads, num_draft=0)
    priced = drafter_cls(heads)
    priced.attach(Target(model))
    assert priced.length.cost_key == method  # `spec-zoo costs drafter=...` files its cost under this key
    with pytest.raises(ConfigError, match=f"{section}.{size}=0"):
        heads_cls(model, 0)
    monkey = type("Elsewhere", (drafter_cls,), {"shipped": tmp_path / "nothing"})
    with pytest.raises(ConfigError, match="shipped .* are missing.*drafter.heads=DIR"):
        monkey()


@pytest.mark.parametrize("method", list(METHODS))
def test_the_adaptive_length_reads_the_measured_draft_cost(method):
    """`spec-zoo costs drafter=...` files a drafter's measured cost per drafted level in the table under
    its key (`draft_key`): an adaptive Hydra or MLP speculator chain prices its length with it (one
    attach with Medusa's, `spec_zoo.staged.LevelDrafter`), so dear drafting drafts shorter than cheap,
    and a table without its entry keeps the configured ``token_cost``."""
    heads_cls, drafter_cls = METHODS[method][:2]
    model = tiny_llama(4)
    drafter = drafter_cls(staged_heads(heads_cls, model), num_draft=2, adaptive=True, token_cost=0.01,
                          learn_cost=False)
    drafter.attach(Target(model))
    for _ in range(20):
        drafter.length.update(3, 2)  # acceptance ~0.67 per token

    def chosen(drafts: dict[str, float]) -> int:
        table = CostTable([1.0] * 8, "m", "eager", "float64", 1, "x", drafts=drafts)
        state = DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=table)
        return drafter.length.choose(state=state)

    assert chosen({method: 0.6}) < chosen({method: 0.01}) == chosen({"medusa": 0.6}) == 3


# -- training end to end, artefact, refusals ------------------------------------------------


def _cfg(method, tmp_path, *overrides):
    section, size = METHODS[method][3:]
    return train_cfg(f"train_{method}", tmp_path, f"{section}.vocab_size=48", f"{section}.{size}=3", *overrides)


@pytest.fixture(scope="module", params=list(METHODS))
def trained(request, tmp_path_factory):
    method = request.param
    tmp = tmp_path_factory.mktemp(method)
    model = teacher()
    recipe = METHODS[method][2]
    cfg = _cfg(method, tmp)
    return method, model, train_module(cfg, recipe.from_config(cfg), Target(model)), tmp


def test_training_lowers_loss_and_raises_acceptance(trained):
    method, _, path, _ = trained
    heads_cls = METHODS[method][0]
    record = json.loads((path / heads_cls.RECORD).read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"]
    assert after["tau_chain"] > before["tau_chain"]
    assert after["stage2_greedy"] > before["stage2_greedy"]
    assert record["steps"] == 40 and record["draft_vocab_size"] == 48 and record["target"]["fingerprint"]
    assert sorted(p.name for p in path.iterdir()) == sorted([heads_cls.RECORD, heads_cls.WEIGHTS])


def test_distribution_labels_train_on_the_targets_top_k(trained):
    """labels=distributions (Hydra++'s teacher distillation) trains on another loss than the
    written tokens' cross-entropy, from the same start, and lowers it."""
    method, model, path, tmp = trained
    section = METHODS[method][3]
    cfg = _cfg(method, tmp / "soft", f"{section}.labels=distributions", "train.steps=10")
    soft = json.loads((train_module(cfg, METHODS[method][2].from_config(cfg), Target(model))
                       / METHODS[method][0].RECORD).read_text())
    hard = json.loads((path / METHODS[method][0].RECORD).read_text())
    assert soft["config"][section]["labels"] == "distributions"
    assert soft["heldout_before"]["loss"] != pytest.approx(hard["heldout_before"]["loss"], rel=1e-3)
    assert soft["heldout_after"]["loss"] < soft["heldout_before"]["loss"]


@pytest.mark.parametrize("tree", [None, {"policy": "topk", "width": 2, "depth": 3}])
def test_trained_heads_load_back_and_draft_losslessly(trained, tree):
    method, model, path, _ = trained
    drafter_cls = METHODS[method][1]
    out = SpeculativeDecoder(Target(model), drafter_cls(str(path), tree=tree)).generate(
        PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30) and out.stats.accepted > 0
    built = generate(PROMPT, drafter=method, model=Target(model), max_new_tokens=12, heads=str(path))
    assert built.ids == hf_greedy(model, PROMPT, 12, eos=1)[: len(built.ids)] and built.stats.drafted > 0


def test_refuses_another_target_and_corrupt_files(trained, tmp_path):
    method, model, path, _ = trained
    heads_cls, drafter_cls = METHODS[method][:2]
    with pytest.raises(ConfigError, match="trained for target"):
        SpeculativeDecoder(Target(teacher(seed=4)), drafter_cls(str(path)))
    from spec_zoo.draft_head import load_head

    # weights with trained LM-head rows, recorded as heads that share the target's: they do not fit
    check_corrupt_files_fail(lambda p, m: load_head(heads_cls, p, m, "drafter.heads", "train"), path,
                             tmp_path / "bad", heads_cls, heads_cls(model, 3, torch.arange(48), train_head=True), model)


def test_bad_training_config_fails_before_any_model_load(tmp_path, monkeypatch):
    import spec_zoo.train.loop as loop

    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    for method, (_, _, recipe, section, size) in METHODS.items():
        for override, message in [(f"{section}.{size}=0", f"{section}.{size}=0"),
                                  (f"{section}.decay=0", f"{section}.decay=0"),
                                  (f"{section}.vocab_size=-2", f"{section}.vocab_size=-2"),
                                  (f"{section}.labels=soft", f"{section}.labels='soft'")]:
            cfg = _cfg(method, tmp_path / method, override)
            with pytest.raises(ConfigError, match=message):
                train_module(cfg, recipe.from_config(cfg))
