"""The docs cannot drift from the configs: every key of every shipped option of the groups
`spec-zoo` takes is documented in docs/configs.md, in the section of its option."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONFIGS_MD = (ROOT / "docs" / "configs.md").read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The text under the first heading that starts with ``heading`` (hashes included), up
    to the next heading of the same or a higher level."""
    match = re.search(rf"^{re.escape(heading)}.*$", CONFIGS_MD, re.M)
    assert match, f"docs/configs.md has no section {heading!r}"
    level = len(heading) - len(heading.lstrip("#"))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(CONFIGS_MD, match.end())
    return CONFIGS_MD[match.end(): end.start() if end else len(CONFIGS_MD)]


def documented(key: str, text: str) -> bool:
    return re.search(rf"`{re.escape(key)}[`:= ]", text) is not None


def options(group: str) -> list[Path]:
    return sorted((ROOT / "conf" / group).glob("*.yaml"))


def own_keys(path: Path) -> list[str]:
    return [k for k in OmegaConf.load(path) if k != "defaults" and not (k.startswith("_") and k != "_target_")]


@pytest.mark.parametrize("path", options("drafter"), ids=lambda p: p.stem)
def test_every_drafter_key_is_in_its_section(path):
    text = section(f"### `{path.stem}`")
    missing = [k for k in own_keys(path) if not documented(k, text)]
    assert not missing, f"docs/configs.md, section `{path.stem}`, lacks {missing}"


@pytest.mark.parametrize("group", ["verifier", "generation", "model"])
def test_every_key_and_option_of_the_group_is_in_its_section(group):
    text = section(f"## `{group}`")
    for path in options(group):
        missing = [k for k in own_keys(path) if not documented(k, text)]
        assert not missing, f"docs/configs.md, section `{group}`, lacks {missing} of {path.name}"
        if len(options(group)) > 1:
            assert documented(path.stem, text), f"docs/configs.md, section `{group}`, lacks the option {path.stem}"


def test_top_level_keys_are_documented():
    text = section("## Top level")
    config = OmegaConf.load(ROOT / "conf" / "config.yaml")
    missing = [k for k in config if k not in ("defaults", "hydra") and not documented(k, text)]
    assert not missing


def test_every_bench_method_is_in_the_benchmark_docs():
    text = (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8")
    methods = text[text.index("## Methods"): text.index("## Dataset")]
    missing = [p.stem for p in options("method") if f"`{p.stem}`" not in methods]
    assert not missing, f"docs/benchmark.md, section Methods, lacks {missing}"


REFERENCE_DOCS = ["README.md", "docs/configs.md", "docs/benchmark.md", "docs/ablations.md", "docs/coming_from.md"]


@pytest.mark.parametrize("doc", [ROOT / d for d in REFERENCE_DOCS if (ROOT / d).exists()], ids=lambda p: p.name)
def test_docs_point_only_at_files_that_exist(doc):
    """Markdown links resolve; a bare FILE.md named in the text exists somewhere in the repo."""
    text = doc.read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text) if not t.startswith("http")]
    missing = [t for t in links if not (doc.parent / t).exists()]
    named = set(re.findall(r"\b([A-Z]+\.md)\b", text))
    missing += [n for n in named if not any(p for p in ROOT.rglob(n) if ".venv" not in p.parts)]
    assert not missing, f"{doc.name} points at {missing}"
