"""The layout's rules, read from the source: imports run one way (core <- methods <-
training), inference never imports training, and docs/architecture.md's module map lists
every module of the package (and nothing that does not exist)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from spec_zoo import SpeculativeDecoder

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("spec_zoo", "drafters", "verifiers")
# consumers of methods (they sit above them): training, and the test harness for plugin authors
ABOVE_METHODS = ("spec_zoo/train/", "spec_zoo/testing.py")
# the one allowed exception: validating a spec-zoo-train command line needs the loss names
# (a lazy import that only runs for train configs)
TRAINING_ALLOWED = {"spec_zoo/schema.py": {"spec_zoo.train.losses"}}


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for top in SOURCES for p in (ROOT / top).rglob("*.py"))


def imported(path: str) -> set[str]:
    """Every module name ``path`` imports (top level or inside functions)."""
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def is_training(module: str) -> bool:
    return module.startswith("spec_zoo.train") or (module.startswith("spec_zoo.drafters.") and module.endswith(".train"))


def test_core_imports_no_method():
    core = [m for m in modules() if m.startswith("spec_zoo/") and not m.startswith(ABOVE_METHODS)]
    bad = {m: sorted(i for i in imported(m) if i.startswith(("spec_zoo.drafters", "spec_zoo.verifiers")))
           for m in core}
    assert not {m: v for m, v in bad.items() if v}, "the core must build methods by name, not import them"


def test_inference_imports_no_training():
    inference = [m for m in modules() if not m.startswith("spec_zoo/train/") and not m.endswith("/train.py")
                 and m != "spec_zoo/train/__init__.py"]
    bad = {m: sorted(i for i in imported(m) if is_training(i) and i not in TRAINING_ALLOWED.get(m, ())) for m in inference}
    assert not {m: v for m, v in bad.items() if v}


def test_no_top_level_generic_packages():
    text = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"packages = \[(.*?)\]", text, re.S).group(1)
    assert all(p.strip().strip('"').startswith("spec_zoo") for p in packages.split(",") if p.strip())


def test_architecture_module_map_is_complete_and_true():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`((?:spec_zoo|drafters|verifiers)/[\w/]+\.py)`", doc))
    markers = {m for m in modules() if m.endswith("__init__.py") and m.startswith("drafters/")}
    missing = [m for m in modules() if m not in listed and m not in markers]
    assert not missing, f"add these modules to docs/architecture.md's module map: {missing}"
    assert not [m for m in listed if not (ROOT / m).is_file()], "the module map lists files that do not exist"


def test_every_experiment_preset_and_method_composes():
    """Every preset and bench method resolves after the move (no model loads)."""
    from hydra import compose, initialize_config_dir

    from spec_zoo.api import CONF_DIR
    from spec_zoo.bench.methods import resolve_methods
    from spec_zoo.registry import option_names

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for preset in option_names("experiment"):
            cfg = compose("bench", overrides=[f"+experiment={preset}"])
            specs, _ = resolve_methods(cfg.methods, list(cfg.default_methods), cfg)
            assert specs, preset
    specs, notes = resolve_methods(option_names("method"), [])
    assert len(specs) == len(option_names("method")) and not notes


@pytest.mark.real_model
def test_every_shipped_drafter_option_loads_and_decodes_as_plain_greedy(smollm2_target):
    """Every conf/drafter option (shipped artefacts included) builds from its YAML on the
    real target and, under greedy verification, prints plain greedy decoding's tokens."""
    from spec_zoo.api import build_decoder, compose_config
    from spec_zoo.registry import option_names

    prompt, plain = None, None
    for option in option_names("drafter"):
        cfg = compose_config([f"drafter={option}", "prompt=Write a Python function that reverses a list.",
                              "generation.max_new_tokens=12"])
        decoder = build_decoder(cfg, target=smollm2_target)
        prompt = prompt or decoder.encode(cfg.prompt)
        ids = decoder.generate(prompt, 12).ids
        plain = plain or SpeculativeDecoder(smollm2_target).generate(prompt, 12).ids
        assert ids == plain, option
