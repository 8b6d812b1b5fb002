"""docs/tutorial_new_drafter.md cannot rot: its Python blocks run in order, its shell
commands name installed programs and compose as configs, its YAML and TOML parse."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

TUTORIAL = Path(__file__).parents[1] / "docs" / "tutorial_new_drafter.md"
BIN = Path(sys.executable).parent  # the venv's scripts, whether or not the venv is on PATH


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", TUTORIAL.read_text(), re.S)


def commands() -> list[list[str]]:
    return [shlex.split(line) for block in blocks("bash") for line in block.splitlines() if line.strip()]


def test_the_tutorial_has_code_to_check():
    assert len(blocks("python")) >= 3 and len(commands()) >= 4
    assert len(blocks("yaml")) == 1 and len(blocks("toml")) == 1


def test_the_drafter_is_about_30_lines():
    drafter = blocks("python")[0]
    assert "class BigramDrafter(Drafter)" in drafter and len(drafter.splitlines()) <= 35


@pytest.mark.real_model
def test_python_blocks_run_in_order(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(blocks("python")):
        exec(compile(block, f"{TUTORIAL.name}[python block {i}]", "exec"), namespace)
    assert namespace["cert"].tv <= 1e-9 and namespace["out"].stats.tau > 1.0


@pytest.mark.parametrize("argv", commands(), ids=lambda argv: " ".join(argv)[:60])
def test_shell_commands_exist(argv):
    assert (BIN / argv[0]).is_file(), f"{argv[0]} is not an installed command (pip install -e .)"


def test_config_snippets_parse_as_shown():
    option = yaml.safe_load(blocks("yaml")[0])
    assert option == {"_target_": "my_drafters.bigram.BigramDrafter", "num_draft": 6}
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    entry = tomllib.loads(blocks("toml")[0])["project"]["entry-points"]["spec_zoo.drafters"]
    assert entry == {"bigram": "my_drafters.bigram:BigramDrafter"}


def test_spec_zoo_commands_compose(tmp_path):
    """Each `spec-zoo` command (plugin option names aside) composes: --cfg job loads no model."""
    conf = tmp_path / "my_conf" / "drafter"
    conf.mkdir(parents=True)
    (conf / "bigram.yaml").write_text(blocks("yaml")[0])
    checked = 0
    for argv in commands():
        if argv[0] != "spec-zoo" or "list" in argv or ("drafter=bigram" in argv and "--config-dir" not in argv):
            continue
        argv = [a.replace("my_conf", str(tmp_path / "my_conf")) for a in argv]
        done = subprocess.run([str(BIN / "spec-zoo"), *argv[1:], "--cfg", "job"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "BigramDrafter" in done.stdout
        checked += 1
    assert checked >= 1
