"""Self-speculation by early exit (`drafters/early_exit.py`): KV reuse really skips the
shallow layers at verification and keeps every layer's cache consistent, the exit
adapter trains end to end and stays exact, and bad input fails clearly.

Greedy identity and sampling exactness of every early-exit variant (reuse on/off,
adapter on/off) run with the other drafters in test_greedy_identity.py and
test_sampling_exact.py (tests/drafts.py line-up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.drafters.early_exit.adapter import ExitAdapter, load_adapter
from spec_zoo.drafters.early_exit.drafter import RETIRED, EarlyExitDrafter, shipped_adapter
from spec_zoo.drafters.early_exit.train import train_exit_adapter
from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from spec_zoo.testing import assert_lossless, certify_model
from tests.drafts import exit_adapter
from tests.heads import check_corrupt_files_fail, teacher, train_cfg
from tests.tiny import hf_greedy, one_thread, tiny_llama  # noqa: F401 (autouse fixture)

PROMPT = [5, 9, 12, 5, 9, 12, 7, 3]


def _layer_calls(model) -> tuple[list[int], list]:
    """Positions processed by each decoder layer (forward hooks)."""
    counts = [0] * len(model.model.layers)

    def hook(i):
        return lambda module, args, kwargs, out: counts.__setitem__(i, counts[i] + args[0].shape[1])

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(model.model.layers)]
    return counts, handles


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
def test_reuse_skips_the_shallow_layers_and_changes_nothing(exit_layer):
    model = tiny_llama(4, layers=4, sharpness=3.0)
    runs = {}
    for reuse in (True, False):
        counts, handles = _layer_calls(model)
        drafter = EarlyExitDrafter(exit_layer, num_draft=3, adaptive=False, reuse_kv=reuse)
        out = SpeculativeDecoder(Target(model), drafter).generate(PROMPT, max_new_tokens=30)
        for h in handles:
            h.remove()
        runs[reuse] = (out, counts)
    (fast, shared), (slow, separate) = runs[True], runs[False]
    assert fast.ids == slow.ids == hf_greedy(model, PROMPT, 30)
    assert fast.stats.drafted > 0
    E = exit_layer
    # with reuse every shallow layer sees each position once (in the draft pass) ...
    assert len(set(shared[:E])) == 1 and len(set(shared[E:])) == 1
    # ... and the target's verification does not run them again
    assert shared[0] < separate[0] and shared[E:] == separate[E:]
    assert separate[0] - shared[0] >= fast.stats.drafted  # at least the drafted positions saved


def test_all_layer_caches_rewind_together():
    model = tiny_llama(5, layers=3, sharpness=3.0)
    target = Target(model)
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(1, num_draft=4, adaptive=False))
    tokens, cut_short = list(PROMPT), 0
    for step in decoder.steps(PROMPT, max_new_tokens=40, eos_token_ids=[]):
        tokens += step
        # shallow and deep layers alike hold exactly the committed tokens but the last
        assert {layer.get_seq_length() for layer in target.cache.layers} == {len(tokens) - 1}
        assert target.cached_tokens == tokens[:-1]
        cut_short += len(step) < 5  # a draft of 4 was rejected somewhere: the caches were rewound
    assert cut_short > 0


def test_adapter_with_reduced_vocabulary_is_exact_when_sampling():
    """Reduced draft vocabulary (q = 0 on a quarter of the tokens), KV reuse, T = 1: the exact
    law (enumerated) is the target's, and drafts are partly accepted."""
    model = certify_model()
    adapter = exit_adapter(model)
    cert = assert_lossless(lambda m: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=True, adapter=adapter),
                           model=model)
    assert 1 < cert.tau < 3


# -- the adapter: training end to end, artefact, refusals ------------------------------


def _cfg(tmp_path, *overrides):
    return train_cfg("train_early_exit", tmp_path, "adapter.exit_layer=1", "adapter.vocab_size=48", *overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exit")
    model = teacher()
    return model, train_exit_adapter(_cfg(tmp), target=Target(model)), tmp


def test_training_lowers_loss_and_raises_acceptance(trained):
    _, path, _ = trained
    record = json.loads((path / "adapter.json").read_text())
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < before["loss"] and after["alpha_sampled"] > before["alpha_sampled"]
    assert record["exit_layer"] == 1 and record["draft_vocab_size"] == 48 and record["steps"] == 40
    assert record["data"]["forced_prompts"] == 16 and record["target"]["vocab_size"] == 64
    assert sorted(p.name for p in path.iterdir()) == ["adapter.json", "adapter.safetensors"]


@pytest.mark.parametrize("reuse", [True, False])
def test_trained_adapter_loads_back_and_drafts_losslessly(trained, reuse):
    model, path, _ = trained
    drafter = EarlyExitDrafter(1, num_draft=3, adaptive=False, adapter=str(path), reuse_kv=reuse)
    out = SpeculativeDecoder(Target(model), drafter).generate(PROMPT, max_new_tokens=30, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 30)
    assert out.stats.accepted > 0
    loaded = load_adapter(path, model, 1)
    assert not any(p.requires_grad for p in loaded.parameters()) and loaded.vocab_ids.numel() == 48


def test_training_is_deterministic(trained, tmp_path):
    model, path, _ = trained
    again = train_exit_adapter(_cfg(tmp_path), target=Target(model))
    a, b = (json.loads((p / "adapter.json").read_text())["heldout_after"] for p in (path, again))
    assert a == b


def test_refuses_an_adapter_for_another_target_or_exit(trained):
    _, path, _ = trained
    with pytest.raises(ConfigError, match="trained for target.*embedding weights differ"):
        load_adapter(path, teacher(seed=4))
    with pytest.raises(ConfigError, match="trained for exit layer 1, not drafter.exit_layer=2"):
        SpeculativeDecoder(Target(teacher()), EarlyExitDrafter(2, adapter=str(path)))


def test_corrupt_adapter_files_fail_clearly(trained, tmp_path):
    model, path, _ = trained
    check_corrupt_files_fail(load_adapter, path, tmp_path / "bad", ExitAdapter,
                             ExitAdapter(model, 1, 2, mlp=False, vocab_ids=torch.arange(48)), model)


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("exit_layer", [0, 3, 7])
def test_exit_layer_outside_the_model_fails_clearly(exit_layer):
    with pytest.raises(ConfigError, match=r"exit_layer=.*(1\.\.2|>= 1)"):
        SpeculativeDecoder(Target(tiny_llama(0, layers=3)), EarlyExitDrafter(exit_layer))


@pytest.mark.parametrize("kwargs,match", [({"stop_below": 1.5}, "stop_below"), ({"sample": "x"}, "sample"),
                                          ({"num_draft": 0}, "num_draft")])
def test_bad_drafter_options_fail_clearly(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EarlyExitDrafter(1, **kwargs)


def test_non_llama_models_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(ConfigError, match="Llama-family"):
        SpeculativeDecoder(Target(gpt2), EarlyExitDrafter(1))


def test_no_shipped_adapter_for_an_exit_layer_is_a_clear_error():
    with pytest.raises(ConfigError, match="no adapter is shipped for exit layer 1"):
        shipped_adapter(1)


@pytest.mark.parametrize("override,key", [("adapter.exit_layer=0", "adapter.exit_layer"),
                                          ("adapter.vocab_size=-1", "adapter.vocab_size"),
                                          ("loss=kl", "loss")])
def test_bad_training_config_fails_before_any_model_load(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train_exit_adapter(_cfg(tmp_path, override), target="not loaded")


# -- configs and the shipped adapters ---------------------------------------------------


def test_configs_compose_and_build():
    from spec_zoo.registry import build_component

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        plain = compose("config", overrides=["drafter=early_exit", "drafter.exit_layer=1"])
        adapted = compose("config", overrides=["drafter=early_exit_adapter"])
        bench = compose("bench", overrides=["+experiment=early_exit"])
    assert adapted.drafter.adapter == "shipped" and adapted.drafter._target_ == plain.drafter._target_
    drafter = build_component(plain.drafter, "drafter")
    out = SpeculativeDecoder(Target(tiny_llama(0)), drafter).generate(PROMPT, max_new_tokens=8)
    assert len(out.ids) == 8
    names = set(bench.methods)
    assert {"ar", "early_exit", "early_exit_adapter", "hf_early_exit"} <= names
    from spec_zoo.bench.specs import resolve_methods

    specs, _ = resolve_methods(["hf_early_exit"], [])
    hf = next(s for s in specs if s.name == "hf_early_exit")
    assert hf.engine == "transformers" and hf.drafter_label == "early_exit" and hf.params == {"assistant_early_exit": 8}
    assert {f"early_exit_e{E}" for E in (4, 12, 16)} <= names
    assert not {f"early_exit_adapter_e{E}" for E in (4, 12, 16)} & names  # their adapters no longer ship


def test_shipped_adapters_refuse_another_target():
    record = json.loads((shipped_adapter(8) / "adapter.json").read_text())
    assert record["exit_layer"] == 8 and record["target"]["name"] == "smollm2-135m"
    with pytest.raises(ConfigError, match="trained for target 'smollm2-135m'"):
        load_adapter(shipped_adapter(8), tiny_llama(0, layers=12))


@pytest.mark.parametrize("exit_layer", RETIRED)
def test_a_retired_adapter_is_refused_by_name_with_the_command_that_remakes_it(exit_layer):
    with pytest.raises(ConfigError, match=rf"smollm2-135m-exit{exit_layer} no longer ships.*`spec-zoo-train "
                                          rf"early_exit adapter.exit_layer={exit_layer} output.dir=DIR`"):
        shipped_adapter(exit_layer)
    records = Path(__file__).parents[1] / "records"  # kept in the repository, so spec-zoo-train remakes them
    record = json.loads((records / "early_exit" / f"smollm2-135m-exit{exit_layer}.json").read_text())
    assert record["exit_layer"] == exit_layer and record["config"]["adapter"]["exit_layer"] == exit_layer
    assert "smollm2-135m-exit{4,12,16}.json" in (records / "README.md").read_text()


@pytest.mark.real_model
@pytest.mark.parametrize("exit_layer,adapter,reuse", [(8, "shipped", True), (8, "shipped", False), (8, None, True)])
def test_lossless_on_the_real_target(smollm2_target, exit_layer, adapter, reuse):
    plain = SpeculativeDecoder(smollm2_target)
    drafter = EarlyExitDrafter(exit_layer, num_draft=3, adaptive=False, adapter=adapter, reuse_kv=reuse)
    decoder = SpeculativeDecoder(smollm2_target, drafter)
    for question in ("Name three colours.", "Translate to French: the cat sleeps on the warm windowsill."):
        prompt = plain.encode(question)
        out = decoder.generate(prompt, max_new_tokens=32)
        assert out.ids == plain.generate(prompt, max_new_tokens=32).ids
        assert out.stats.drafted > 0


@pytest.mark.real_model
def test_sampling_with_the_adapter_runs_on_the_real_target(smollm2_target):
    drafter = EarlyExitDrafter(8, num_draft=3, adaptive=False, adapter="shipped")
    decoder = SpeculativeDecoder(smollm2_target, drafter, sampling=SamplingParams(temperature=0.7))
    out = decoder.generate("Name three colours.", max_new_tokens=24, seed=1)
    assert len(out.ids) > 0 and out.stats.drafted > 0
    again = SpeculativeDecoder(smollm2_target, EarlyExitDrafter(8, num_draft=3, adaptive=False, adapter="shipped"),
                               sampling=SamplingParams(temperature=0.7)).generate("Name three colours.",
                                                                                max_new_tokens=24, seed=1)
    assert again.ids == out.ids  # seeded


def test_kv_reuse_on_a_compiled_bfloat16_target_is_refused_with_the_fix(tiny_llama):
    """Reusing the eager draft's shallow KV makes the verify resume eagerly from layer E: in bf16 that is
    not the compiled graph's arithmetic (on the real target 9 of 13 outputs differed from plain decoding),
    so it is refused, not run; reuse_kv=false is accepted. Nothing compiles (attach comes first)."""
    from spec_zoo.runtime import CompiledTarget

    target = CompiledTarget(tiny_llama(layers=3, dtype=torch.float32).to(torch.bfloat16), max_cache_len=64)
    with pytest.raises(ConfigError, match=r"^drafter.reuse_kv=true on a compiled bfloat16 target .* set "
                                          r"drafter.reuse_kv=false"):
        EarlyExitDrafter(2, reuse_kv=True).attach(target)
    EarlyExitDrafter(2, reuse_kv=False).attach(target)
