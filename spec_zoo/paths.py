"""Where spec-zoo keeps what it makes on a machine: one root for converted models, cost
tables and compiled kernels, so one environment variable moves them all."""

from __future__ import annotations

import os
from pathlib import Path

from spec_zoo.errors import ConfigError


def cache_root() -> Path:
    """``$SPEC_ZOO_CACHE`` or ``~/.cache/spec_zoo/models``; a path that cannot be a directory (a
    file, or below one) is a one-line `ConfigError` here, not a traceback where it is first made."""
    root = Path(os.environ.get("SPEC_ZOO_CACHE") or Path.home() / ".cache" / "spec_zoo" / "models")
    anchor = next((p for p in (root, *root.parents) if p.exists()), None)
    if anchor is not None and not anchor.is_dir():
        raise ConfigError(f"SPEC_ZOO_CACHE: {root} cannot be spec-zoo's cache directory: {anchor} is a file; point "
                          "SPEC_ZOO_CACHE at a directory (or unset it for ~/.cache/spec_zoo/models).")
    return root
