"""Shared fixtures: tiny random models for fast tests, the embedded target for truth."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_tiny_llama(seed: int = 0, **config) -> LlamaForCausalLM:
    """A random float64 Llama (vocab 64, hidden 32, 2 layers, 4 heads, 2 kv heads);
    ``config`` overrides any LlamaConfig field (e.g. max_position_embeddings=16)."""
    fields = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    fields.update(config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**fields)).to(torch.float64).eval()


@pytest.fixture
def tiny_llama():
    """Factory fixture: ``tiny_llama(seed=0, **config_overrides)`` -> LlamaForCausalLM."""
    return make_tiny_llama


@pytest.fixture(scope="session")
def smollm2_target():
    """The embedded default target (converted to the user cache on first use)."""
    from spec_zoo.models import load_target

    return load_target()


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load the target: bad input must be rejected first."""

    def refuse(**_):
        raise AssertionError("the target was loaded before the bad input was rejected")

    monkeypatch.setattr("spec_zoo.api.load_target", refuse)
