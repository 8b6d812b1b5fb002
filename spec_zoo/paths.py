"""Where spec-zoo keeps what it makes on a machine: one root for converted models, cost
tables and compiled kernels, so one environment variable moves them all."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$SPEC_ZOO_CACHE`` or ``~/.cache/spec_zoo/models``."""
    return Path(os.environ.get("SPEC_ZOO_CACHE") or Path.home() / ".cache" / "spec_zoo" / "models")
