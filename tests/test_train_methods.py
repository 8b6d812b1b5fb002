"""Trained methods register themselves from their own folder: the training commands, the
config validation and the report find them (spec_zoo.train.methods), no list names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR, option_names
from spec_zoo.train.cli import command_keys, commands
from spec_zoo.train.methods import recipe_of_artefact, recipes, register

ROOT = Path(__file__).resolve().parents[1]


def test_every_method_package_with_a_recipe_is_a_command_with_its_config_and_drafter():
    packages = sorted(p.parent.name for p in (ROOT / "drafters").glob("*/train.py"))
    found = recipes()
    assert len(packages) == 7 and len(found) == 8  # eagle/train.py registers two: eagle and eagle3
    assert {cls.__module__.split(".")[2] for cls in found.values()} == set(packages)
    assert commands()[: len(found)] == list(found) and {"report", "translations", "export"} <= set(commands())
    for name, cls in found.items():
        assert cls.name == name and (Path(CONF_DIR) / f"train_{name}.yaml").is_file()
        assert cls.drafter in option_names("drafter") and cls.artefact[0].endswith(".json")


def test_a_recipe_adds_its_own_keys_to_the_pipeline_keys():
    assert "adapter.exit_layer" in command_keys("early_exit").limits
    assert "adapter.exit_layer" not in command_keys("eagle").limits
    assert "train.lr" in command_keys("report").limits and "loss" in command_keys("distill").choices


def test_a_second_recipe_under_a_taken_name_is_refused():
    class Other:
        pass

    with pytest.raises(ConfigError, match="spec-zoo-train eagle is registered twice"):
        register("eagle")(Other)  # type: ignore[arg-type]
    assert recipes()["eagle"].__name__ == "EagleRecipe"


def test_an_artefact_is_read_by_the_recipe_that_wrote_it(tmp_path):
    for cls in recipes().values():
        folder = tmp_path / cls.name
        folder.mkdir()
        (folder / cls.artefact[0]).write_text("{}")
        assert recipe_of_artefact(folder) is cls
    with pytest.raises(ConfigError, match="report.artefacts: .* holds none of distill.json, eagle.json, "
                                          "eagle3_training.json, adapter.json"):
        recipe_of_artefact(tmp_path)
