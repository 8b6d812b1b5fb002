"""The trained methods: each registers its recipe from its own folder, and the training
commands find them here instead of naming them.

A method's ``drafters/<method>/train.py`` decorates its recipe class with
``@register("<name>")``: that makes ``spec-zoo-train <name>`` run it on
``conf/train_<name>.yaml``, validates that config with the recipe's `Keys`, and lets
``spec-zoo-train report`` read its artefacts (by their record file). `recipes` imports every
method package's ``train`` module, so registration needs no list anywhere (the pattern of
vLLM speculators' class registry: a decorator keyed by name, filled by importing the package).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from pathlib import Path

from spec_zoo.errors import ConfigError
from spec_zoo.train.recipe import Recipe

_REGISTERED: dict[str, type[Recipe]] = {}


def register(name: str) -> Callable[[type[Recipe]], type[Recipe]]:
    """Class decorator: ``cls`` is the recipe of ``spec-zoo-train <name>``."""

    def add(cls: type[Recipe]) -> type[Recipe]:
        other = _REGISTERED.get(name)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise ConfigError(f"spec-zoo-train {name} is registered twice: {other.__module__}.{other.__qualname__} "
                              f"and {cls.__module__}.{cls.__qualname__}; rename one.")
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return add


def recipes() -> dict[str, type[Recipe]]:
    """name -> recipe class of every trained method (each ``drafters/<method>/train.py``
    imported, which registers it), by name."""
    import spec_zoo.drafters

    for info in pkgutil.iter_modules(spec_zoo.drafters.__path__):
        module = f"spec_zoo.drafters.{info.name}.train"
        if info.ispkg and importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    return dict(sorted(_REGISTERED.items()))


def recipe_of_artefact(path: Path, key: str = "report.artefacts") -> type[Recipe]:
    """The recipe whose artefact ``path`` holds (by its record file)."""
    found = recipes().values()
    for cls in found:
        if (path / cls.artefact[0]).is_file():
            return cls
    records = ", ".join(cls.artefact[0] for cls in found)
    raise ConfigError(f"{key}: {str(path)!r} holds none of {records}; give trained artefact dirs.")
