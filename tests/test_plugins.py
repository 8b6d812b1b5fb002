"""Discovery: an installed package's drafter is an option like a shipped one, and a broken
registration (not a Drafter, a name registered twice or shadowing a shipped option) is a
clear error. The plugin is really installed (pip, into a temp dir put on PYTHONPATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROMPT = "prompt=List three colours."


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(ROOT / "tests" / "plugin_pkg")],
                   check=True, capture_output=True, timeout=300)
    return target


def _fake_dist(site: Path, name: str, entry: str) -> None:
    """A second installed distribution registering ``entry`` under spec_zoo.drafters."""
    info = site / f"{name}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[spec_zoo.drafters]\n{entry}\n")


def run(script: str, *args: str, path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([str(BIN / script), *args], capture_output=True, text=True, env=env, timeout=300)


def test_list_shows_the_plugin(site):
    out = run("spec-zoo", "list", path=site)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("repeat "))
    assert "[plugin: spec-zoo-repeat-plugin]" in line and "Repeats the last committed token" in line
    section = out.stdout[out.stdout.index("\nverifiers ("):].split("\nmethods")[0]
    lossy = {x.split()[0] for x in section.splitlines()[1:] if "LOSSY" in x}
    assert "block " in section and lossy == {"typical"}  # the one lossy rule shipped says so


@pytest.mark.real_model
def test_installed_plugin_runs_by_name_and_is_lossless(site):
    base = run("spec-zoo", PROMPT, "generation.max_new_tokens=8", "drafter=none", path=site)
    plug = run("spec-zoo", PROMPT, "generation.max_new_tokens=8", "drafter=repeat", "drafter.num_draft=3",
               "compare=false", path=site)
    assert base.returncode == 0 and plug.returncode == 0, plug.stderr
    text, summary = plug.stdout.rstrip("\n").rsplit("\n", 1)
    assert "drafter=repeat" in summary and "8 tokens" in summary
    assert text == base.stdout.rstrip("\n").rsplit("\n", 1)[0]  # greedy verification: the plain output


@pytest.mark.parametrize("entry, message", [
    ("notdrafter = spec_zoo_repeat_plugin:NotADrafter", "is not a subclass of spec_zoo.Drafter"),
    ("repeat = spec_zoo_repeat_plugin:NotADrafter", "is registered twice"),
    ("ngram = spec_zoo_repeat_plugin:RepeatDrafter", "clashes with the shipped drafter=ngram"),
    ("broken = spec_zoo_repeat_plugin_missing:X", "cannot be imported"),
])
def test_bad_registrations_are_clear_errors(site, tmp_path, entry, message):
    bad = tmp_path / "site"
    subprocess.run(["cp", "-r", str(site), str(bad)], check=True)
    _fake_dist(bad, "spec-zoo-bad-plugin", entry)
    every_cli = [("spec-zoo", ["list"]), ("spec-zoo", [PROMPT]), ("spec-zoo-bench", ["--dry-run"])]
    for script, args in every_cli if "notdrafter" in entry else every_cli[:1]:
        out = run(script, *args, path=bad)
        assert out.returncode == 2, (script, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, (script, out.stderr)
