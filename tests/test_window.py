"""docs/devices/window.py is what a lent GPU window runs (issue 43): its dry mode runs every stage here
on the CPU at tiny sizes, so the script works before the window comes. The compiled runtime's compile is
replaced by its eager fallback (the graph is the same; compiling it would take a minute of this CPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).parents[1]
TRACES = "docs/trees/projection"  # the eager Spec-Bench traces the window projects by default
FILES = {"environment.json", "log.txt", "costs_smollm2-135m.json", "costs_llama-1b.json", "identity.json",
         "projection.md", "costs.png"}


@pytest.fixture(scope="module")
def window():
    spec = importlib.util.spec_from_file_location("window", ROOT / "docs/devices/window.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_compiling(monkeypatch):
    """The compiled runtime's graph run without compiling it (compile_graph's own fallback)."""
    monkeypatch.setattr("spec_zoo.runtime.compiled.compile_graph",
                        lambda fn, under, inputs, *args, **kwargs: (under(fn), 0.0, False))


def test_dry_run_writes_every_result(window, tmp_path, no_compiling):
    out = tmp_path / "out"
    code = window.main(["--dry", "--out", str(out), "--shapes", "smollm2-135m,llama-1b", "--traces", TRACES,
                        "--drafters", "none,eagle_k3,hydra_k3,suffix"])
    assert code == 0, (out / "log.txt").read_text()
    assert {p.name for p in out.iterdir()} == FILES  # the device tool brings back at most 8 files
    for shape in ("smollm2-135m", "llama-1b"):
        record = json.loads((out / f"costs_{shape}.json").read_text())
        assert record["errors"] == {} and set(record["tables"]) == {"eager", "compiled"}
        for table in record["tables"].values():
            assert len(table["seconds"]) == 4 and min(table["seconds"]) > 0 and set(table["contexts"]) == {"16"}
        assert record["config"]["hidden_size"] in (576, 2048)  # the real shape is recorded beside the dry one
    identity = json.loads((out / "identity.json").read_text())
    assert identity["summary"] == {"drafters": 4, "all_equal": True, "failing": []}
    projection = (out / "projection.md").read_text()
    assert projection.count("PROJECTION (cost model, not a measurement)") == 2  # eager and compiled tables
    log = (out / "log.txt").read_text()
    assert "stage plot: ok" in log and "done:" in log
    assert json.loads((out / "environment.json").read_text())["dry"] is True


def test_a_failing_stage_is_recorded_and_the_next_runs(window, tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(window.Window, "costs", broken)
    out = tmp_path / "out"
    code = window.main(["--dry", "--out", str(out), "--stages", "costs,projection", "--traces", TRACES, "nowhere"])
    assert code == 1
    log = (out / "log.txt").read_text()
    assert "stage costs: ERROR RuntimeError: no such kernel" in log and "stage projection: ok" in log
    projection = (out / "projection.md").read_text()
    assert "No cost table of smollm2-135m was measured" in projection and "traces nowhere: not here" in projection
