"""spec-zoo: speculative decoding as drafter x verifier strategies around one loop.

The names below are imported on first use (PEP 562), so ``import spec_zoo.errors`` or a console
script's wrapper (`spec_zoo.console`) runs before torch loads: Ctrl-C during those seconds is
then one line, not a traceback."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_PUBLIC = {
    "generate": "spec_zoo.api",
    "Output": "spec_zoo.decoder",
    "SpeculativeDecoder": "spec_zoo.decoder",
    "Draft": "spec_zoo.draft",
    "ConfigError": "spec_zoo.errors",
    "DecodeState": "spec_zoo.interfaces",
    "Drafter": "spec_zoo.interfaces",
    "Verdict": "spec_zoo.interfaces",
    "Verifier": "spec_zoo.interfaces",
    "SamplingParams": "spec_zoo.sampling",
    "logits_to_probs": "spec_zoo.sampling",
    "Target": "spec_zoo.runtime.target",
}

__all__ = [  # = _PUBLIC's names (a literal, for linters and type checkers)
    "ConfigError",
    "DecodeState",
    "Draft",
    "Drafter",
    "Output",
    "SamplingParams",
    "SpeculativeDecoder",
    "Target",
    "Verdict",
    "Verifier",
    "generate",
    "logits_to_probs",
]

if TYPE_CHECKING:
    from spec_zoo.api import generate
    from spec_zoo.decoder import Output, SpeculativeDecoder
    from spec_zoo.draft import Draft
    from spec_zoo.errors import ConfigError
    from spec_zoo.interfaces import DecodeState, Drafter, Verdict, Verifier
    from spec_zoo.runtime.target import Target
    from spec_zoo.sampling import SamplingParams, logits_to_probs


def __getattr__(name: str):
    """A public name from its module, or a submodule (``spec_zoo.models``), imported now."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
