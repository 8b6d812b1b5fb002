"""Rewrite trained artefacts in place in the current layout (issue 60): weight matrices stored as
``quantize`` says (`spec_zoo.artefacts.storage_tensors`), nothing the target holds (a distilled
draft's input embeddings, an untrained head's LM-head rows) stored, only recorded by digest.

Each artefact is read by its own loader (any format version it reads) and written by its own
writer, so what comes out is what training would write today. A parallel draft's updates are
kept as they are; its record then names the rewritten base draft's digest (``base.sha256``) and
the one it was trained against (``base.requantized_from``). Give a parallel draft together
with its base distilled draft: both are read, and checked, before anything is written.

    python -m spec_zoo.train.requantize int8 DIR [DIR ...]     # or int6, int5, int4, or none (float16)
    python -m spec_zoo.train.requantize int8 --head int6 DIR   # a trained output layer at its own width
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from spec_zoo.artefacts import check_quantize
from spec_zoo.errors import ConfigError

#: record fields the writers compute themselves (the rest of a record is carried over)
_WRITTEN = {"format", "format_version", "dtype", "quantize", "quantize_head", "group", "from_target"}


def _was(record: dict) -> dict:
    """The rest of ``record`` (what its writer does not compute), plus how it was stored before
    (``requantized_from``: the first layout, when rewritten more than once)."""
    before = {k: record.get(k) for k in ("format_version", "dtype", "quantize", "quantize_head") if k in record}
    return {**{k: v for k, v in record.items() if k not in _WRITTEN},
            "requantized_from": record.get("requantized_from", before)}


def requantize(paths, target_model, quantize: str | None, quantize_head: str | None = None) -> list[Path]:
    """Rewrite each artefact dir of ``paths`` (distilled draft, parallel draft, or a spec-zoo head)
    with its matrices stored as ``quantize`` (a trained output layer as ``quantize_head`` when given);
    the dirs written, in order."""
    from spec_zoo.drafters.distilled.drafter import SHIPPED as SHIPPED_DISTILLED
    from spec_zoo.drafters.distilled.student import RECORD as DISTILLED
    from spec_zoo.drafters.parallel.model import RECORD as PARALLEL
    from spec_zoo.drafters.parallel.model import base_dir, read_parallel
    from spec_zoo.train.trim import _spec_zoo_heads

    for key, kind in (("quantize", quantize), ("--head", quantize_head)):
        check_quantize(kind, key, floats="none")
    paths = [Path(p).expanduser() for p in paths]
    parallel = {}  # read (and their base checked) before any base is rewritten
    for p in paths:
        if (p / PARALLEL).is_file():
            record, tensors = read_parallel(p)
            parallel[p] = (record, tensors, base_dir(record, SHIPPED_DISTILLED, p))
    done = []
    for p in [p for p in paths if p not in parallel]:  # the bases first
        if (p / DISTILLED).is_file():
            done.append(_distilled(p, target_model, quantize, quantize_head))
            continue
        cls = next((c for c in _spec_zoo_heads() if (p / c.RECORD).is_file()), None)
        if cls is None:
            raise ConfigError(f"{p} is no spec-zoo artefact this rewrites (a distilled or parallel draft, or a head).")
        done.append(_head(cls, p, target_model, quantize, quantize_head))
    for p, (record, tensors, base) in parallel.items():
        done.append(_parallel(p, record, tensors, base, quantize))
    return done


def _distilled(path: Path, target_model, quantize: str | None, quantize_head: str | None) -> Path:
    from spec_zoo.drafters.distilled.student import save_artefact, student_from_pretrained

    student, record = student_from_pretrained(path, target_model)
    assert record is not None
    rest = {k: v for k, v in _was(record).items() if k not in {"input_embeddings", "draft_vocab"}}
    return save_artefact(student, path, rest, dtype="float16", quantize=quantize, quantize_head=quantize_head)


def _head(cls, path: Path, target_model, quantize: str | None, quantize_head: str | None) -> Path:
    from spec_zoo.draft_head import load_head, save_head

    head = load_head(cls, path, target_model, "requantize", "spec-zoo-train")
    rest = {k: v for k, v in _was(head.record).items() if k not in {"target", *head.describe()}}
    return save_head(head, path, head.record["target"], rest, quantize=quantize, quantize_head=quantize_head)


def _parallel(path: Path, record: dict, tensors: dict, base: Path, quantize: str | None) -> Path:
    from spec_zoo.drafters.parallel.model import MASKS, save_parallel, weights_digest

    updates = {n[: -len(".up")]: (tensors[n], tensors[n[: -len(".up")] + ".down"]) for n in tensors
               if n.endswith(".up")}
    dense = {n[: -len(".delta")]: t for n, t in tensors.items() if n.endswith(".delta")}
    digest = weights_digest(base)
    info = dict(record["base"])
    if digest != info.get("sha256"):
        info["requantized_from"] = info.get("requantized_from", info.get("sha256"))
        info["sha256"] = digest
    rest = {k: v for k, v in _was(record).items() if k not in {"k", "rank", "base"}}
    return save_parallel(path, tensors[MASKS], updates, {**rest, "base": info}, dense=dense, quantize=quantize)


def main(argv: list[str]) -> None:
    from spec_zoo.models import load_target

    def kind(word: str) -> str | None:
        return None if word in ("none", "null") else word

    head = None
    if len(argv) > 2 and argv[1] == "--head":
        head, argv = kind(argv[2]), argv[:1] + argv[3:]
    if len(argv) < 2:
        raise SystemExit(__doc__)
    target = load_target()
    with torch.no_grad():
        for path in requantize(argv[1:], target.model, kind(argv[0]), head):
            print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
