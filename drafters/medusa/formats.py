"""Medusa heads in FasterDecoding/Medusa's layout: read them, and write spec-zoo's in it.

The layout (``medusa/model/medusa_model.py``): ``config.json`` with ``medusa_num_heads`` and
``medusa_num_layers``, and ``medusa_lm_head.safetensors`` holding head i as
``Sequential(ResBlock × medusa_num_layers, Linear(H→V, no bias))``: keys
``{i}.{j}.linear.weight/bias`` for the blocks and ``{i}.{medusa_num_layers}.weight`` for its
own LM head. Each head reads the target's last-layer state (after the final norm) and
block j computes ``x + SiLU(linear(x))``, as `spec_zoo.drafters.medusa.heads.ResBlock`.

The layout has no draft vocabulary, so spec-zoo's reduced-vocabulary heads are written with
zero LM-head rows outside it, and rows that are zero in every head are read back as outside
the draft vocabulary (q exactly zero there; no trained row is all zeros). An engine reading
the file sees logit 0 for those tokens instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from spec_zoo.artefacts import write_artefact
from spec_zoo.drafters.medusa.heads import MedusaHeads, ResBlock
from spec_zoo.errors import ConfigError

WEIGHTS = "medusa_lm_head.safetensors"
FORMATS = ("auto", "spec_zoo", "medusa")


class PublishedMedusaHeads(torch.nn.Module):
    """K heads, each its blocks then its own LM head over the draft vocabulary ``vocab_ids``."""

    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab: int, dtype: torch.dtype):
        super().__init__()
        self.num_heads = num_heads
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(hidden, dtype) for _ in range(num_layers)],
                                torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype))
            for _ in range(num_heads))
        self.vocab_ids: torch.Tensor | None = None

    def lm_heads(self) -> list[torch.nn.Linear]:
        """Each head's own LM head (the last module of its blocks)."""
        return [cast(torch.nn.Linear, cast(torch.nn.Sequential, head)[-1]) for head in self.heads]

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_heads()[0].weight.dtype

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """Logits [..., K, V_draft] of every head for states [..., H]."""
        return torch.stack([head(states) for head in self.heads], dim=-2)

    def keep_rows(self, ids: torch.Tensor) -> None:
        """Restrict every head's LM head to the rows ``ids`` (the draft vocabulary)."""
        for lm_head in self.lm_heads():
            lm_head.weight = torch.nn.Parameter(lm_head.weight.detach()[ids], requires_grad=False)
        self.vocab_ids = ids


def load_published_medusa(path, target_model, key: str = "drafter.heads") -> PublishedMedusaHeads:
    """The Medusa heads at ``path`` (FasterDecoding's layout), checked against ``target_model``."""
    path = Path(path).expanduser()
    try:
        config = json.loads((path / "config.json").read_text())
        num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    except FileNotFoundError:
        raise ConfigError(f"{key}={str(path)!r} has no config.json (medusa_num_heads, medusa_num_layers).") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{key}: {path / 'config.json'} has no valid medusa_num_heads ({type(e).__name__}: {e}); "
                          "re-download the heads.") from None
    file = path / WEIGHTS
    if not file.is_file():
        pt = " (medusa_lm_head.pt found: spec-zoo reads safetensors only, never pickles; convert it with " \
             "safetensors.torch.save_file)" if (path / "medusa_lm_head.pt").is_file() else ""
        raise ConfigError(f"{key}={str(path)!r} has no {WEIGHTS}{pt}.")
    try:
        with safe_open(str(file), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle is not iterable)
    except Exception as e:
        raise ConfigError(f"{key}: {file} cannot be read ({type(e).__name__}: {str(e)[:120]}); "
                          "re-download it.") from None
    vocab, hidden = target_model.lm_head.weight.shape
    if num_heads < 1 or num_layers < 0:
        raise ConfigError(f"{key}: medusa_num_heads={num_heads}, medusa_num_layers={num_layers}; "
                          "need at least one head.")
    head0 = tensors.get(f"0.{num_layers}.weight")
    if head0 is not None and tuple(head0.shape) != (vocab, hidden):
        raise ConfigError(f"{key}: the heads predict {head0.shape[0]} tokens from states of size {head0.shape[1]} but "
                          f"the target has a vocabulary of {vocab} and hidden size {hidden}; use heads trained for "
                          "this target.")
    heads = PublishedMedusaHeads(num_heads, num_layers, hidden, vocab, target_model.lm_head.weight.dtype)
    try:
        heads.heads.load_state_dict({k: v.to(heads.dtype) for k, v in tensors.items()})
    except RuntimeError as e:
        raise ConfigError(f"{key}={str(path)!r}: the weights do not match medusa_num_heads={num_heads}, "
                          f"medusa_num_layers={num_layers} ({str(e).splitlines()[1].strip()[:160]}); re-download "
                          "the heads.") from None
    if not all(torch.isfinite(p).all() for p in heads.parameters()):
        raise ConfigError(f"{key}={str(path)!r}: the weights hold NaN or infinite values; re-download the heads.")
    used = torch.stack([(h.weight != 0).any(dim=1) for h in heads.lm_heads()]).any(dim=0)
    if not used.any():
        raise ConfigError(f"{key}={str(path)!r}: every LM-head row is zero; re-download the heads.")
    if not used.all():  # spec-zoo's reduced draft vocabulary, written as zero rows
        heads.keep_rows(used.nonzero().flatten())
    return heads.to(target_model.device).eval().requires_grad_(False)


def save_medusa(heads: MedusaHeads, out_dir, vocab: int, base_model: str | None,
                dtype: torch.dtype = torch.float16) -> Path:
    """Write spec-zoo's Medusa heads (for a target of ``vocab`` tokens) in FasterDecoding's
    layout, one block per head, atomically."""
    rows = heads.head.detach().cpu()
    if heads.vocab_ids is not None:
        full = torch.zeros(vocab, rows.shape[1], dtype=rows.dtype)
        full[heads.vocab_ids.cpu()] = rows
        rows = full
    tensors = {}
    for i, block in enumerate(heads.blocks):
        linear = cast(ResBlock, block).linear
        tensors[f"{i}.0.linear.weight"] = linear.weight.detach().cpu().to(dtype).contiguous()
        tensors[f"{i}.0.linear.bias"] = linear.bias.detach().cpu().to(dtype).contiguous()
        tensors[f"{i}.1.weight"] = rows.to(dtype).clone().contiguous()
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": 1, "base_model_name_or_path": base_model,
              "hidden_size": int(rows.shape[1]), "vocab_size": int(rows.shape[0])}
    return write_artefact(out_dir, "config.json", config, lambda tmp: save_file(tensors, str(tmp / WEIGHTS)),
                          key="export.out", fmt="Medusa layout")
