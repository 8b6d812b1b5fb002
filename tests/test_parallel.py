"""Parallel drafting (`drafters/parallel/`): a distilled draft with trained mask tokens drafts k
tokens in one forward.

Greedy identity (chain, static tree x greedy, rejection) and block verification run with the
other drafters (tests/drafts.py line-up), certified cells in test_certify.py. Here: each step's
draft is one draft forward whose k rows are what the trained model computes for those k
positions (the training layout, `ParallelStudent.anchored`), the masks' KV sits after the real
tokens only until the next step; sampled chains and trees certified exact under rejection and
block verification, a broken rule caught; training end to end on a tiny model (the mask rows
learn), the artefact loads back and drafts losslessly; bad settings and changed files fail clearly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from spec_zoo import SpeculativeDecoder, Target
from spec_zoo.api import generate
from spec_zoo.drafters.parallel.drafter import ParallelDrafter
from spec_zoo.drafters.parallel.model import RECORD, WEIGHTS
from spec_zoo.drafters.parallel.train import ParallelRecipe
from spec_zoo.errors import ConfigError
from spec_zoo.sampling import to_full_vocab
from spec_zoo.testing import CERTIFY_SETTINGS, assert_lossless
from spec_zoo.train.loop import train_module
from spec_zoo.verifiers.block import BlockVerifier
from tests.drafts import parallel_draft, parallel_drafter
from tests.heads import teacher, train_cfg
from tests.test_certify import SkipResidual
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

PROMPT = [5, 9, 12, 5, 9, 12, 7, 3]
TREE = [[0], [1], [0, 0], [1, 0], [0, 0, 0]]


def test_one_draft_forward_gives_what_the_trained_model_computes():
    model = tiny_llama(4, sharpness=3.0)
    path = parallel_draft(model, k=4)
    student = ParallelRecipe().load(path, model).double()
    seen = []

    class Spy(ParallelDrafter):
        def _ask(self, state, depth):
            self.before = self.runner.forwards
            return super()._ask(state, depth)

        def _from_rows(self, state, logits, depth):
            tokens, fed = list(state.tokens), self.runner.cached_tokens
            # one forward; then the cache holds the real tokens and, after them, this step's masks only
            assert self.runner.forwards == self.before + 1
            assert fed[: len(tokens)] == tokens and fed[len(tokens):] == self.mask_ids[: depth - 1]
            assert self.runner.cache.get_seq_length() == len(fed)
            seen.append((tokens, self.to_target_vocab(logits)))
            return super()._from_rows(state, logits, depth)

    out = SpeculativeDecoder(Target(model), Spy(path, dtype="float64")).generate(PROMPT, max_new_tokens=16,
                                                                                 eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 16) and len(seen) > 3
    for tokens, rows in seen:
        ids = torch.tensor([tokens])
        states = student.anchored(ids, torch.ones_like(ids), torch.tensor([len(tokens) - 1]))[0]  # [k, H]
        expect = to_full_vocab(student.head(states), student.vocab_ids, 64)[: len(rows)]
        assert torch.equal(torch.isinf(rows), torch.isinf(expect))  # token 1: outside the draft vocabulary
        torch.testing.assert_close(rows[torch.isfinite(rows)], expect[torch.isfinite(expect)], atol=1e-5, rtol=0)
    assert max(len(rows) for _, rows in seen) == 4  # k rows from one forward


def test_the_training_layout_is_a_decode_step_per_anchor():
    """Anchors of a padded batch, each with its masks, in one forward: row i after anchor j is
    the same as a forward of the tokens up to j and i masks alone."""
    model = tiny_llama(4)
    student = ParallelRecipe().load(parallel_draft(model, k=3), model).double()
    ids = torch.tensor([[5, 9, 12, 5, 9, 12], [7, 3, 22, 40, 0, 0]])
    mask = (torch.arange(6) < torch.tensor([[6], [4]])).long()
    where = torch.tensor([2, 5, 6 + 1, 6 + 3])  # flat b * L + j
    states = student.anchored(ids, mask, where)
    body = student.base().model
    for n, w in enumerate(where.tolist()):
        b, j = divmod(w, 6)
        alone = torch.tensor([ids[b, : j + 1].tolist() + [64, 65]])
        expect = body(inputs_embeds=student.embedding()(alone)).last_hidden_state[0, j:]
        torch.testing.assert_close(states[n], expect, atol=1e-9, rtol=0)


def test_sampled_chains_and_trees_are_certified_exact():
    setting = "t0.7_topk3_topp0.75"  # (T=1 enumerates ~20x the branches: the certification table's cells)
    for shape in ({"num_draft": 2}, {"tree": {"policy": "static", "choices": TREE[:4]}}):
        cert = assert_lossless(lambda m, kw=shape: parallel_drafter(m, **kw), sampling=CERTIFY_SETTINGS[setting])
        assert cert.tau > 1.0
    assert_lossless(lambda m: parallel_drafter(m, num_draft=2), BlockVerifier(), CERTIFY_SETTINGS[setting])


def test_a_broken_rule_is_caught():
    with pytest.raises(AssertionError, match="exact total variation"):
        assert_lossless(lambda m: parallel_drafter(m, num_draft=2), SkipResidual(),
                        CERTIFY_SETTINGS["t0.7_topk3_topp0.75"])


def test_bad_settings_and_changed_files_fail_clearly(tmp_path):
    model = tiny_llama(4)
    path = parallel_draft(model)
    with pytest.raises(ConfigError, match="drafter.num_draft=4 but .* k=3"):
        ParallelDrafter(path, num_draft=4)
    with pytest.raises(ConfigError, match="not a parallel draft"):
        ParallelDrafter(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / WEIGHTS).write_bytes((path / WEIGHTS).read_bytes()[:100])
    with pytest.raises(ConfigError, match="corrupt or incomplete"):
        ParallelDrafter(bad)
    moved = tmp_path / "moved"
    shutil.copytree(path, moved)
    record = json.loads((path / RECORD).read_text())
    (moved / RECORD).write_text(json.dumps({**record, "base": {**record["base"], "sha256": "0" * 64}}))
    with pytest.raises(ConfigError, match="has changed since"):
        ParallelDrafter(moved)
    with pytest.raises(ConfigError, match="trained for target"):
        SpeculativeDecoder(Target(tiny_llama(5)), ParallelDrafter(path))


# -- training end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    model = teacher()
    base = parallel_draft(model, dtype="float32").parent / "base"
    cfg = train_cfg("train_parallel", tmp, f"parallel.base={base}", "parallel.k=3", "parallel.rank=4",
                    "parallel.alpha=4", "train.steps=30", "loss=fkl")
    return model, train_module(cfg, ParallelRecipe.from_config(cfg), Target(model))


def test_training_teaches_the_masks(trained):
    _, path = trained
    record = json.loads((path / RECORD).read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"]
    assert after["pos2_greedy"] > before["pos2_greedy"] and after["pos3_greedy"] > before["pos3_greedy"]
    assert record["k"] == 3 and record["rank"] == 4 and record["steps"] == 30
    assert sorted(p.name for p in path.iterdir()) == sorted([RECORD, WEIGHTS])


@pytest.mark.parametrize("tree", [None, {"policy": "topk", "width": 2, "depth": 3}])
def test_the_trained_draft_loads_back_and_drafts_losslessly(trained, tree):
    model, path = trained
    out = SpeculativeDecoder(Target(model), ParallelDrafter(str(path), tree=tree)).generate(
        PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 24) and out.stats.accepted > 0
    built = generate(PROMPT, drafter="parallel", model=Target(model), max_new_tokens=12, path=str(path))
    assert built.ids == hf_greedy(model, PROMPT, 12, eos=1)[: len(built.ids)] and built.stats.drafted > 0


def test_a_draft_trained_whole_ships_its_changes_and_drafts_losslessly(tmp_path):
    """``parallel.update=full`` (PARD's recipe): every weight of the draft trains, not a low-rank
    update; the artefact holds each weight's change, and loads back onto the base."""
    from safetensors.torch import load_file

    model = teacher()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    base = parallel_draft(model, dtype="float32").parent / "base"
    cfg = train_cfg("train_parallel", tmp_path, f"parallel.base={base}", "parallel.k=3", "parallel.update=full",
                    "train.steps=30", "train.lr=3e-3", "loss=fkl")
    path = train_module(cfg, ParallelRecipe.from_config(cfg), Target(model))
    record = json.loads((path / RECORD).read_text())
    assert record["base"]["update"] == "full" and record["rank"] == 0
    assert record["heldout_after"]["pos2_greedy"] > record["heldout_before"]["pos2_greedy"]
    tensors = load_file(str(path / WEIGHTS))
    deltas = [n for n in tensors if n.endswith(".delta")]
    assert deltas and not any(n.endswith((".up", ".down")) for n in tensors)
    assert any(".layers." in n and "mlp" in n for n in deltas)  # beyond the masks: the layers trained
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())  # the target untouched
    out = SpeculativeDecoder(Target(model), ParallelDrafter(str(path))).generate(PROMPT, max_new_tokens=24,
                                                                                eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 24) and out.stats.accepted > 0


def test_bad_training_config_fails_before_any_model_load(tmp_path, monkeypatch):
    import spec_zoo.train.loop as loop

    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    for override, message in [("parallel.k=1", "parallel.k=1"), ("parallel.rank=0", "parallel.rank=0"),
                              ("parallel.decay=0", "parallel.decay=0"),
                              (f"parallel.base={tmp_path / 'none'}", "is not a directory"),
                              ("parallel.modules=[]", "parallel.modules is empty"),
                              ("parallel.update=lora", "parallel.update"),
                              ("output.quantize_head=int6", "a parallel draft stores no output layer")]:
        cfg = train_cfg("train_parallel", tmp_path, override)
        with pytest.raises(ConfigError, match=message):
            train_module(cfg, ParallelRecipe.from_config(cfg))
