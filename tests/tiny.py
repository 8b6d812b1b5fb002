"""Tiny random Llama models: fast stand-ins for a target and its draft in tests (built by
`spec_zoo.testing`, the public harness), plus the one-thread fixture."""

from __future__ import annotations

import pytest
import torch

from spec_zoo.testing import hf_greedy, tiny_llama

__all__ = ["hf_greedy", "one_thread", "tiny_llama"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (thread hand-offs dominate); restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
