"""EAGLE feature drafting (`drafters/eagle.py`, `spec_zoo/eagle.py`): the head reads the
target's true features and its cache keeps only exact positions across rejections; the
head trains end to end and stays lossless; bad input fails clearly.

Greedy identity and sampling exactness of the EAGLE drafter run with the other drafters
in test_greedy_identity.py and test_sampling_exact.py (tests/drafts.py line-up)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import spec_zoo.drafters.eagle.drafter as eagle_module
from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.api import generate
from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.eagle.formats import Eagle3Head, load_published
from spec_zoo.drafters.eagle.head import EagleHead, load_eagle
from spec_zoo.drafters.eagle.train import train_eagle, train_eagle3
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import causal_mask
from spec_zoo.testing import assert_lossless, certify_model
from tests.drafts import eagle_head
from tests.heads import check_corrupt_files_fail, teacher, train_cfg
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

PROMPT = [5, 9, 12, 5, 9, 12, 7, 3]


class FromScratch(EagleDrafter):
    """Reference: forgets its cache before every draft, so each draft is computed from the
    target's features of the whole committed sequence; it also records those features."""

    def propose(self, state):
        self.cache.crop(0) if self.cache.get_seq_length() else None
        self._fed, self._exact = [], 0
        draft = super().propose(state)
        self.seen_features = torch.cat(self._features) if self._features else None
        return draft


def test_cached_drafts_equal_drafts_from_scratch_and_features_are_the_targets():
    model = tiny_llama(5, layers=3, sharpness=3.0)
    head = eagle_head(model)
    outs, drafts = {}, {}
    for cls in (EagleDrafter, FromScratch):
        drafter = cls(head, num_draft=3, adaptive=False)
        seen = []
        decoder = SpeculativeDecoder(Target(model), drafter)
        original = drafter.propose
        drafter.propose = lambda state, f=original, seen=seen: seen.append(f(state).tokens.tolist()) or _last(seen)
        outs[cls] = decoder.generate(PROMPT, max_new_tokens=40, eos_token_ids=[])
        drafts[cls] = seen
    assert drafts[EagleDrafter] == drafts[FromScratch]  # the cache crop/recompute logic changes nothing
    assert outs[EagleDrafter].ids == outs[FromScratch].ids == hf_greedy(model, PROMPT, 40)
    assert outs[EagleDrafter].stats.drafted > 0
    # the features the drafter keeps are the target's last-layer features of the committed tokens
    drafter = FromScratch(head, num_draft=3, adaptive=False)
    decoder = SpeculativeDecoder(Target(model), drafter)
    ids = decoder.generate(PROMPT, max_new_tokens=20, eos_token_ids=[]).ids
    full = torch.tensor([PROMPT + ids])
    with torch.no_grad():
        expected = model.model(input_ids=full).last_hidden_state[0]
    n = drafter.seen_features.shape[0]
    assert n >= len(PROMPT) and torch.allclose(drafter.seen_features, expected[:n], atol=1e-6)


def _last(seen):
    from spec_zoo.draft import Draft

    return Draft.chain(seen[-1])


def test_reduced_vocabulary_head_is_exact_when_sampling():
    """q = 0 on a quarter of the tokens, T = 1: the exact law (enumerated) is the target's,
    and drafts are partly accepted (1 < tau < 3 generated tokens)."""
    model = certify_model()
    head = eagle_head(model)
    cert = assert_lossless(lambda m: EagleDrafter(head, num_draft=3, adaptive=False, sample=True), model=model)
    assert 1 < cert.tau < 3


# -- training end to end, artefact, refusals ----------------------------------------------


def _cfg(tmp_path, *overrides, config="train_eagle"):
    return train_cfg(config, tmp_path, "head.vocab_size=48", *overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eagle")
    model = teacher()
    return model, train_eagle(_cfg(tmp), target=Target(model)), tmp


def test_training_lowers_loss_and_raises_acceptance(trained):
    _, path, _ = trained
    record = json.loads((path / "eagle.json").read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"]
    assert after["alpha_sampled"] > before["alpha_sampled"]
    assert record["draft_vocab_size"] == 48 and record["steps"] == 40 and record["target"]["vocab_size"] == 64
    assert sorted(p.name for p in path.iterdir()) == ["eagle.json", "eagle.safetensors"]


def test_trained_head_loads_back_and_drafts_losslessly(trained):
    model, path, _ = trained
    out = SpeculativeDecoder(Target(model), EagleDrafter(str(path), num_draft=3, adaptive=False)).generate(
        PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30)
    assert out.stats.accepted > 0
    head = load_eagle(path, model)
    assert not any(p.requires_grad for p in head.parameters()) and head.vocab_ids.numel() == 48


def test_trained_head_samples_exactly(trained):
    model, path, _ = trained
    sampled = SpeculativeDecoder(Target(model), EagleDrafter(str(path), num_draft=3, adaptive=False),
                                 sampling=SamplingParams(temperature=1.0))
    a = sampled.generate(PROMPT, max_new_tokens=20, eos_token_ids=[], seed=7)
    b = sampled.generate(PROMPT, max_new_tokens=20, eos_token_ids=[], seed=7)
    assert a.ids == b.ids and a.stats.drafted > 0  # seeded: reproducible


def test_training_is_deterministic(trained, tmp_path):
    model, path, _ = trained
    again = train_eagle(_cfg(tmp_path), target=Target(model))
    a, b = (json.loads((p / "eagle.json").read_text())["heldout_after"] for p in (path, again))
    assert a == b


def test_feature_loss_weight_changes_training(trained, tmp_path):
    model, path, _ = trained
    other = train_eagle(_cfg(tmp_path, "head.regress=0", "train.steps=10"), target=Target(model))
    record = json.loads((other / "eagle.json").read_text())
    assert record["config"]["head"]["regress"] == 0 and record["heldout_after"]["loss"] != pytest.approx(
        json.loads((path / "eagle.json").read_text())["heldout_after"]["loss"])


def test_refuses_a_head_for_another_target(trained):
    _, path, _ = trained
    with pytest.raises(ConfigError, match="drafter.head=.*trained for target.*embedding weights differ"):
        load_eagle(path, teacher(seed=4))
    with pytest.raises(ConfigError, match="trained for target"):
        SpeculativeDecoder(Target(teacher(seed=4)), EagleDrafter(str(path)))


def test_corrupt_head_files_fail_clearly(trained, tmp_path):
    model, path, _ = trained
    check_corrupt_files_fail(load_eagle, path, tmp_path / "bad", EagleHead,
                             EagleHead(model, 2, mlp=False, vocab_ids=torch.arange(48)), model)


def test_bad_config_fails_before_any_model_load(tmp_path, monkeypatch):
    import spec_zoo.train.loop as distill

    monkeypatch.setattr(distill, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    for override, message in [("head.regress=-1", "head.regress=-1"), ("head.vocab_size=-2", "head.vocab_size=-2"),
                              ("loss=mse", "loss='mse'")]:
        with pytest.raises(ConfigError, match=message):
            train_eagle(_cfg(tmp_path, override))
    with pytest.raises(ConfigError, match="drafter.sample='sometimes'"):
        EagleDrafter(eagle_head(teacher()), sample="sometimes")


def test_missing_shipped_head_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(eagle_module, "SHIPPED", tmp_path / "nothing")
    with pytest.raises(ConfigError, match="shipped EAGLE head is missing.*drafter.head=DIR"):
        EagleDrafter()


def test_first_step_drafts_nothing_then_drafts():
    """The target has not read the prompt before the first step: no features, no draft."""
    model = tiny_llama(2, sharpness=3.0)
    out = SpeculativeDecoder(Target(model), EagleDrafter(eagle_head(model), num_draft=2, adaptive=False)).generate(
        PROMPT, max_new_tokens=12, eos_token_ids=[])
    steps = out.stats.steps
    assert steps[0].drafted == 0 and all(s.drafted > 0 for s in steps[1:-1])


def test_config_builds_the_eagle_drafter(trained):
    """``drafter=eagle drafter.head=DIR`` from the Hydra config, as the CLI builds it."""
    model, path, _ = trained
    out = generate(PROMPT, drafter="eagle", model=Target(model), max_new_tokens=12, head=str(path), num_draft=2,
                   adaptive=False)
    assert out.ids == hf_greedy(model, PROMPT, 12, eos=1)[: len(out.ids)] and out.stats.drafted > 0


# -- EAGLE-3 heads trained here (spec-zoo-train eagle3) ------------------------------------


@pytest.fixture(scope="module")
def trained3(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eagle3")
    model = teacher()
    return model, train_eagle3(_cfg(tmp, "head.ttt_steps=2", config="train_eagle3"), target=Target(model)), tmp


def test_eagle3_head_starts_as_the_targets_layer_continuing_its_state():
    """fc passes the last fused layer's state through and the layer is that target layer, so
    the untrained head's output at position j is the target's state after that layer."""
    model = teacher()
    head = Eagle3Head.from_target(model, (0, 1, 2), 2).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        states = model.model(input_ids=ids, output_hidden_states=True).hidden_states
        fused = torch.cat([states[i] for i in (0, 1, 2)], -1)
        T = ids.shape[1]
        out = head(head.inputs(model.model.embed_tokens(ids), fused), head.rotary(fused, torch.arange(T)[None]),
                   None, causal_mask(0, T, fused.dtype, fused.device))
        after = model.model.layers[2](states[2], attention_mask=causal_mask(0, T, fused.dtype, fused.device),
                                      position_embeddings=model.model.rotary_emb(states[2], torch.arange(T)[None]))
    assert torch.allclose(out, after[0] if isinstance(after, tuple) else after, atol=1e-5)


def test_eagle3_training_lowers_loss_and_writes_a_speculators_head(trained3):
    _, path, _ = trained3
    record = json.loads((path / "eagle3_training.json").read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"] and after["alpha_sampled"] > before["alpha_sampled"]
    assert "alpha_depth2" in after and record["steps"] == 40
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "eagle3_training.json", "model.safetensors"]
    config = json.loads((path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 48
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 1, 0]  # EAGLE-3's default for 3 layers
    from spec_zoo.models import converted_dir  # the verifier: a model dir engines can load, not a name

    assert config["speculators_config"]["verifier"]["name_or_path"] == str(converted_dir("smollm2-135m"))


def test_trained_eagle3_head_drafts_losslessly_and_exports_to_the_same_drafts(trained3, tmp_path):
    """The artefact is a published head: drafter=eagle reads it (greedy identical to the
    target, drafts accepted), and the original EAGLE-3 layout exported from it drafts the same."""
    from spec_zoo.train.export import export

    model, path, _ = trained3
    cfg = train_cfg("train_export", tmp_path, f"export.source={path}", "export.format=eagle3",
                    f"export.out={tmp_path / 'eagle3'}", "export.dtype=float32")
    other = export(cfg, target=Target(model))
    runs = {}
    for head in (path, other):
        out = SpeculativeDecoder(Target(model), EagleDrafter(str(head), num_draft=3, adaptive=False)).generate(
            PROMPT, max_new_tokens=30, eos_token_ids=[])
        runs[head] = out
        assert out.ids == hf_greedy(model, PROMPT, 30) and out.stats.accepted > 0
    assert runs[path].stats.accepted == runs[other].stats.accepted


def test_trained_eagle3_head_samples_exactly(trained3):
    model, path, _ = trained3
    model = copy.deepcopy(model).double()  # float64: the law is compared to 1e-9
    head = load_published(path, model, "auto")
    cert = assert_lossless(lambda m: EagleDrafter(head, num_draft=2, adaptive=False, sample=True), model=model,
                           sampling=SamplingParams(temperature=1.0, top_k=4))  # top-k: an enumerable law
    assert cert.tau > 1


def test_eagle3_bad_config_fails_before_any_model_load(tmp_path, monkeypatch):
    import spec_zoo.train.loop as distill

    monkeypatch.setattr(distill, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    for override, message in [("head.regress=0.1", "no feature regression"), ("head.mlp=false", "head.mlp=false"),
                              ("output.layout=medusa", "output.layout")]:
        with pytest.raises(ConfigError, match=message):
            train_eagle3(_cfg(tmp_path, override, config="train_eagle3"))


def test_eagle3_layers_outside_the_target_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"head.target_layers=\[0, 7\]; the target has layers 0..2"):
        train_eagle3(_cfg(tmp_path, "head.target_layers=[0,7]", config="train_eagle3"), target=Target(teacher()))


# -- the head shipped for SmolLM2-135M -----------------------------------------------------


def test_shipped_head_refuses_another_target():
    record = json.loads((eagle_module.SHIPPED / "eagle.json").read_text())
    assert record["target"]["name"] == "smollm2-135m" and record["draft_vocab_size"] == 8192
    with pytest.raises(ConfigError, match="trained for target 'smollm2-135m'"):
        load_eagle(eagle_module.SHIPPED, tiny_llama(0, layers=12))


@pytest.mark.real_model
def test_shipped_head_is_lossless_and_beats_its_initialisation_on_the_real_target(smollm2_target):
    plain = SpeculativeDecoder(smollm2_target)
    shipped = load_eagle(eagle_module.SHIPPED, smollm2_target.model)
    untrained = EagleHead(smollm2_target.model, shipped.init_layer, vocab_ids=shipped.vocab_ids).eval()
    prompts = [plain.encode(question) for question in (
        "Name three colours.", "Translate to French: the cat sleeps on the warm windowsill.",
        "What is 12 times 7? Explain step by step.")]
    references = [plain.generate(prompt, max_new_tokens=48).ids for prompt in prompts]
    rates = {}
    for name, head in (("shipped", shipped), ("untrained", untrained)):
        decoder = SpeculativeDecoder(smollm2_target, EagleDrafter(head, num_draft=3, adaptive=False))
        accepted = drafted = 0
        for prompt, reference in zip(prompts, references):
            out = decoder.generate(prompt, max_new_tokens=48)
            assert out.ids == reference
            accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
        rates[name] = accepted / drafted
    print(rates)
    assert rates["shipped"] > max(0.1, 2 * rates["untrained"])  # training really taught it the target


@pytest.mark.real_model
def test_sampling_with_the_shipped_head_is_seeded(smollm2_target):
    runs = [SpeculativeDecoder(smollm2_target, EagleDrafter(num_draft=3, adaptive=False),
                               sampling=SamplingParams(temperature=0.7)).generate("Name three colours.",
                                                                                  max_new_tokens=24, seed=1)
            for _ in range(2)]
    assert runs[0].ids == runs[1].ids and runs[0].stats.drafted > 0
