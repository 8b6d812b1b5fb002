"""Trim a trained head's draft vocabulary to its K most frequent tokens (FR-Spec, Zhao et al. 2025).

No retraining: the rows kept are the head's own, so the trimmed head drafts exactly as the
whole one wherever its argmax is among the kept tokens, and each drafted token is cheaper (the
head's last matrix is K x H). What it gives up is the coverage of the dropped tokens, which
`spec-zoo-train vocab` shows beside the cost (``vocab.trim_head``). Heads: EAGLE-3 in either
published layout, and spec-zoo's heads over a draft vocabulary (EAGLE, Medusa, Hydra, MLP
speculator, exit adapter).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from spec_zoo.artefacts import STORAGE_DTYPE, write_artefact
from spec_zoo.draft_head import VocabHead, load_head, save_head
from spec_zoo.errors import ConfigError
from spec_zoo.train.batches import select_vocab

#: where a trimmed EAGLE-3 head came from, beside its published files (its training record, when it
#: had one, is copied too with ``trimmed_from`` added: `spec-zoo-train report` reads it as the original)
TRIM_RECORD = "trimmed.json"


def _spec_zoo_heads() -> list[type[VocabHead]]:
    from spec_zoo.drafters.eagle.head import EagleHead
    from spec_zoo.drafters.early_exit.adapter import ExitAdapter
    from spec_zoo.drafters.hydra.heads import HydraHeads
    from spec_zoo.drafters.medusa.heads import MedusaHeads
    from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator

    return [EagleHead, MedusaHeads, HydraHeads, MLPSpeculator, ExitAdapter]


def head_kind(path: Path, key: str = "vocab.trim_head") -> str:
    """What the head at ``path`` is: a spec-zoo head's record name, or ``eagle3`` / ``speculators``;
    anything else is refused by name (before any model loads)."""
    from spec_zoo.drafters.eagle.formats import sniff

    for cls in _spec_zoo_heads():
        if (path / cls.RECORD).is_file():
            return cls.RECORD
    kind = sniff(path, key)
    if kind not in ("eagle3", "speculators"):
        raise ConfigError(f"{key}={str(path)!r} is a {kind} head, which has no draft vocabulary to trim; give an "
                          "EAGLE-3 head or a spec-zoo EAGLE, Medusa, Hydra, MLP-speculator or exit-adapter head.")
    return kind


def kept_tokens(vocab_ids: torch.Tensor | None, counts: torch.Tensor, size: int,
                always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent (by ``counts``) of a head's draft tokens ``vocab_ids`` (None: all
    of the target's), plus those of ``always`` it holds, sorted."""
    V = counts.shape[0]
    held = torch.zeros(V, dtype=torch.bool)
    held[torch.arange(V) if vocab_ids is None else vocab_ids.cpu()] = True
    scores = torch.where(held, counts.double(), torch.tensor(-1.0, dtype=torch.double))  # outside: last
    keep = select_vocab(scores, size, [t for t in always if 0 <= int(t) < V and held[int(t)]])
    return torch.arange(V) if keep is None else keep


def _kept(vocab_ids: torch.Tensor | None, old: torch.Tensor, counts: torch.Tensor, size: int,
          always: Iterable[int]) -> torch.Tensor:
    if size >= old.numel():
        raise ConfigError(f"the head drafts over {old.numel()} tokens; trimming it to {size} keeps them all: give "
                          "a smaller size.")
    return kept_tokens(vocab_ids, counts, size, always)


def _sliced(state: dict, fresh: dict, old_ids: torch.Tensor, keep: torch.Tensor) -> dict:
    """``state`` with the rows of ``keep`` in every tensor whose first dimension is the draft
    vocabulary (those ``fresh``, a head built for ``keep``, has in another shape)."""
    where = torch.full((int(max(old_ids.max(), keep.max())) + 1,), -1, dtype=torch.long)
    where[old_ids.cpu()] = torch.arange(old_ids.numel())
    rows = where[keep]
    if bool((rows < 0).any()):
        raise ValueError("keep holds tokens outside the head's draft vocabulary")
    return {k: v[rows.to(v.device)] if k in fresh and fresh[k].shape != v.shape else v for k, v in state.items()}


def trim_head(path, target_model, counts: torch.Tensor, size: int, out, always: Iterable[int] = ()) -> Path:
    """Write a copy of the head at ``path`` drafting over its ``size`` most frequent tokens to ``out``."""
    path = Path(path).expanduser()
    kind = head_kind(path)
    if size <= 0:
        raise ConfigError(f"a trimmed draft vocabulary of {size} tokens; give a size > 0.")
    if kind in ("eagle3", "speculators"):
        return _trim_eagle3(path, kind, target_model, counts, size, Path(out), always)
    cls = next(c for c in _spec_zoo_heads() if kind == c.RECORD)
    head = load_head(cls, path, target_model, "vocab.trim_head", "spec-zoo-train")
    V = int(target_model.lm_head.weight.shape[0])
    old = head.vocab_ids if head.vocab_ids is not None else torch.arange(V)
    keep = _kept(head.vocab_ids, old, counts, size, always)
    trimmed = cls.from_record(target_model, head.record, keep)
    trimmed.load_state_dict(_sliced(head.state_dict(), trimmed.state_dict(), old, keep) | {"vocab_ids": keep})
    described = {"format", "format_version", "dtype", "quantize", "group", "from_target", "requantized_from", "target",
                 *trimmed.describe()}
    record = {k: v for k, v in head.record.items() if k not in described}
    record["trimmed_from"] = {"path": str(path), "draft_vocab_size": int(old.numel())}
    return save_head(trimmed, out, head.record["target"], record, quantize=head.record.get("quantize"))


def _trim_eagle3(path: Path, layout: str, target_model, counts: torch.Tensor, size: int, out: Path,
                 always: Iterable[int]) -> Path:
    from spec_zoo.drafters.eagle.formats import Eagle3Head, eagle3_files, load_published

    head = load_published(path, target_model, layout, "vocab.trim_head")
    assert isinstance(head, Eagle3Head)  # head_kind let only EAGLE-3 layouts through
    V = int(head.t2d.numel())
    old = head.vocab_ids if head.vocab_ids is not None else torch.arange(V)
    keep = _kept(head.vocab_ids, old, counts, size, always)
    trimmed = Eagle3Head(head.config, head.target_layers, int(head.fc.in_features) // len(head.target_layers),
                         keep.numel(), V, head.norm_before_residual)
    state = _sliced(head.state_dict(), trimmed.state_dict(), old, keep)
    state["d2t"] = keep - torch.arange(keep.numel())
    state["t2d"] = torch.zeros(V, dtype=torch.bool)
    state["t2d"][keep] = True
    trimmed.load_state_dict(state)
    source = json.loads((path / "config.json").read_text())
    verifier = (source.get("speculators_config") or {}).get("verifier", {}).get("name_or_path")
    config, write_weights = eagle3_files(trimmed, layout, verifier, STORAGE_DTYPE)
    trimmed_from = {"path": str(path), "draft_vocab_size": int(old.numel())}

    def write(tmp: Path) -> None:
        write_weights(tmp)
        for record in path.glob("*.json"):  # its training record (what `spec-zoo-train report` reads), marked
            if record.name != "config.json":
                (tmp / record.name).write_text(json.dumps({**json.loads(record.read_text()),
                                                           "trimmed_from": trimmed_from}, indent=1))
        if not (tmp / TRIM_RECORD).exists():
            (tmp / TRIM_RECORD).write_text(json.dumps({"format": "spec-zoo-trimmed-head",
                                                       "trimmed_from": trimmed_from}, indent=1))

    return write_artefact(out, "config.json", config, write, key="vocab.trim_out", fmt=f"{layout} layout")
