"""Shared fixtures: tiny random models for fast tests, the embedded target for truth."""

from __future__ import annotations

import os

# Each xdist worker gets its share of the cores, set before torch loads (and for the CLIs the tests start):
# by default every process runs as many threads as the host has cores, so n workers put n x n threads on n
# cores, and OpenMP's threads spin at each barrier for a sibling the OS has descheduled. On 2 cores with
# 2 workers that cost a third of the real-model tests' time (test_real_model, test_cli, test_everyday:
# 274 s -> 166 s). A user's own OMP_NUM_THREADS is kept.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // WORKERS)))

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.tiny import tiny_llama as make_tiny_llama  # noqa: E402

if WORKERS > 1:  # torch may have loaded before this file (a plugin): set its pool too
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session", autouse=True)
def inductor_cache(tmp_path_factory):
    """One inductor cache dir for the whole run, in tmp, shared by the xdist workers: a graph
    of the same weights compiled by one worker is served to the other (`spec_zoo.runtime.compile_cache`;
    inductor writes its entries atomically), and nothing is read from the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        base = tmp_path_factory.getbasetemp()
        path = (base.parent if base.name.startswith("popen-gw") else base) / "inductor-shared"
        path.mkdir(exist_ok=True)
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def eager_unless_asked(monkeypatch):
    """``model.runtime=auto`` (the default) runs eager in every test: a graph another test compiled into the
    shared cache would otherwise turn a later test's default target compiled, by test order. The tests of
    auto itself undo this (``monkeypatch.undo()``)."""
    monkeypatch.setattr("spec_zoo.runtime.host_fit.compiled_before", lambda model, compiled: False)


@pytest.fixture
def tiny_llama():
    """Factory fixture: ``tiny_llama(seed=0, ..., **config_overrides)`` (see tests/tiny.py)."""
    return make_tiny_llama


@pytest.fixture(scope="session")
def smollm2_target():
    """The embedded default target (converted to the user cache on first use), its float32 weights dense."""
    from spec_zoo.models import load_target

    return load_target()


@pytest.fixture(scope="session")
def smollm2_native():
    """The embedded target as a bare `spec-zoo` runs it here (model.weights=auto: its own 4-bit codes)."""
    from spec_zoo.models import load_target

    return load_target(weights="native")


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load the target: bad input must be rejected first."""

    def refuse(**_):
        raise AssertionError("the target was loaded before the bad input was rejected")

    monkeypatch.setattr("spec_zoo.api.load_target", refuse)
