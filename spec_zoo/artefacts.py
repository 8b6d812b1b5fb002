"""Trained artefacts on disk: a directory of safetensors files plus a JSON record.

Shared by the distilled drafts and the exit adapters: write the whole directory
atomically (a temp dir, then one rename: an interrupted save never leaves half an
artefact), and read a record back with its format and version checked.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from spec_zoo.errors import ConfigError


def write_artefact(out_dir, record_name: str, record: dict, write_files: Callable[[Path], None]) -> Path:
    """Create ``out_dir`` with what ``write_files(tmp_dir)`` writes plus ``record_name``."""
    out_dir = Path(out_dir).expanduser()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        write_files(tmp)
        (tmp / record_name).write_text(json.dumps(record, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def read_record(file: Path, fmt: str, version: int, what: str, fix: str) -> dict:
    """The JSON record at ``file``; a corrupt, foreign or too new one raises `ConfigError`."""
    try:
        record = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file} is corrupt ({e}); {fix}.") from None
    if not isinstance(record, dict) or record.get("format") != fmt:
        found = record.get("format") if isinstance(record, dict) else None
        raise ConfigError(f"{file} is not a spec-zoo {what} record (format={found!r}).")
    if int(record.get("format_version", 0)) > version:
        raise ConfigError(f"{file} has format_version {record['format_version']}; this spec-zoo reads up to "
                          f"{version}: upgrade spec-zoo.")
    return record
