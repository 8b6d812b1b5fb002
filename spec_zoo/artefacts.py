"""Trained artefacts on disk: a directory of safetensors files plus a JSON record, and
the target it was trained for (a fingerprint checked at load time).

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

import torch

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


_FP_ROWS, _FP_DIMS = 16, 8


def target_fingerprint(model) -> list[list[float]]:
    """A few entries of the target's input embedding matrix: enough to tell targets apart,
    robust to the dtype the target is loaded in (compared with a tolerance)."""
    w = model.get_input_embeddings().weight.detach()
    rows = torch.linspace(0, w.shape[0] - 1, _FP_ROWS).long()
    return [[round(float(x), 4) for x in w[r, :_FP_DIMS].float()] for r in rows]


def fingerprint_matches(a, b, tol: float = 2e-2) -> bool:
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if ta.shape != tb.shape:
        return False
    scale = max(float(ta.abs().mean()), 1e-6)
    return float((ta - tb).abs().max()) <= tol * max(scale, 1.0) + 1e-3


def describe_target(model, name: str | None) -> dict:
    cfg = model.config
    return {
        "name": name,
        "model_type": getattr(cfg, "model_type", None),
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "hidden_size": int(cfg.hidden_size),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "fingerprint": target_fingerprint(model),
    }


def check_target(record: dict, target_model, path, key: str = "drafter.path",
                 fix: str = "`spec-zoo-train distill target.path=...`, or drafter=small_model for an undistilled draft") -> None:
    """Refuse an artefact trained for another target, with a message saying which."""
    want = record.get("target") or {}
    have = describe_target(target_model, None)
    problems = [f"{k} {want.get(k)} vs {have[k]}" for k in ("vocab_size", "hidden_size")
                if want.get(k) is not None and want.get(k) != have[k]]
    if not problems and want.get("fingerprint") is not None and not fingerprint_matches(want["fingerprint"], have["fingerprint"]):
        problems.append("the target's embedding weights differ")
    if problems:
        raise ConfigError(
            f"{key}={str(path)!r} was trained for target {want.get('name')!r}, not for this one "
            f"({'; '.join(problems)}). Use one trained for this target ({fix})."
        )
