"""The parallel draft (PARD, Zhou et al., AMD, arXiv 2504.18583) and its artefact.

A parallel draft is a distilled draft (`spec_zoo.drafters.distilled`) that also reads k - 1
*mask tokens*: ids just past the target's input vocabulary (``first``, ``first + 1``, ...),
each with its own trained embedding (`MaskedEmbedding`). Fed after the last real token, mask
i (1-based) stands for the token i places further on, so one forward gives k next-token
distributions: the last real token's row guesses token 1, mask i's row token i + 1.

Artefact (``parallel.json`` + ``parallel.safetensors``): what training changed on top of a base
distilled draft, kept small. The tensors are ``mask_embeddings`` [k - 1, H] and, per adapted
weight W of the base (``<name>``), a low-rank update ``<name>.up`` [out, r] and ``<name>.down``
[r, in] (the scale folded into ``up``): W + up @ down; or, for a draft trained whole
(``parallel.update=full``), the dense change ``<name>.delta`` of each weight: W + delta. The
record names the base (``base.path``, null = the shipped distilled draft) and its weights'
SHA-256 (checked: a changed base is refused), the target it serves, k, the rank and the training
record.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import (
    DEFAULT_QUANTIZE,
    STORAGE_DTYPE,
    check_artefact_values,
    restored_tensors,
    sha256,
    storage_record,
    storage_tensors,
    write_artefact,
)
from spec_zoo.artefacts import read_record as read_json_record
from spec_zoo.errors import ConfigError

RECORD = "parallel.json"
WEIGHTS = "parallel.safetensors"
FORMAT = "spec-zoo-parallel-draft"
FORMAT_VERSION = 2  # 2: matrices may be quantized (``quantize``); 1 (read too): float16
MASKS = "mask_embeddings"


class MaskedEmbedding(torch.nn.Module):
    """The input embeddings ``base`` for real tokens (ids < ``base.num_embeddings``), and row
    ``id - first`` of ``masks`` for the mask tokens that follow them."""

    def __init__(self, base: torch.nn.Embedding, masks: torch.Tensor):
        super().__init__()
        self.base = base
        self.masks = masks
        self.first = int(base.num_embeddings)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        is_mask = ids >= self.first
        real = self.base(ids.masked_fill(is_mask, 0))
        masks = self.masks.to(real.dtype)[(ids - self.first).clamp(0, self.masks.shape[0] - 1)]
        return torch.where(is_mask[..., None], masks, real)


def weights_digest(base: Path) -> str:
    """SHA-256 of a base draft's weight files (what its low-rank updates were trained against)."""
    return sha256(file.read_bytes() for file in sorted(base.glob("*.safetensors")))


def save_parallel(out_dir, masks: torch.Tensor, updates: dict[str, tuple[torch.Tensor, torch.Tensor]],
                  record: dict, dtype: torch.dtype = STORAGE_DTYPE, overwrite: bool = False,
                  dense: dict[str, torch.Tensor] | None = None, quantize: str | None = DEFAULT_QUANTIZE) -> Path:
    """Write the artefact: ``masks`` [k - 1, H], ``updates`` {weight name: (up, down)} and ``dense``
    {weight name: delta} (`storage_tensors`: in ``dtype``, matrices quantized as ``quantize`` says; loading
    restores them in the draft's dtype), and the record (``base``,
    ``target``, training fields) with the format, dtype, k and rank (0: dense changes only) added."""
    parts = {MASKS: masks}
    for name, (up, down) in updates.items():
        parts[f"{name}.up"], parts[f"{name}.down"] = up, down
    for name, delta in (dense or {}).items():
        parts[f"{name}.delta"] = delta
    tensors = storage_tensors(parts, dtype, quantize)
    rank = max((int(d.shape[0]) for _, d in updates.values()), default=0)
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **storage_record(dtype, quantize),
            "k": int(masks.shape[0]) + 1, "rank": rank, **record}
    return write_artefact(out_dir, RECORD, full, lambda tmp: save_file(tensors, str(tmp / WEIGHTS)),
                          overwrite=overwrite)


def read_parallel(path, key: str = "drafter.path") -> tuple[dict, dict[str, torch.Tensor]]:
    """(record, tensors) of a parallel-draft dir; a missing, corrupt or foreign one raises `ConfigError`."""
    path = Path(path).expanduser()
    if not (path / RECORD).is_file():
        raise ConfigError(f"{key}={str(path)!r} has no {RECORD}: it is not a parallel draft (make one with "
                          "`spec-zoo-train parallel`, or drop the key to use the shipped one).")
    record = read_json_record(path / RECORD, FORMAT, FORMAT_VERSION, "parallel-draft", "retrain or re-copy it")
    try:
        tensors = load_file(str(path / WEIGHTS))
    except Exception as e:  # missing, truncated or corrupt safetensors
        raise ConfigError(f"{key}={str(path)!r}: {WEIGHTS} cannot be read ({type(e).__name__}); the parallel "
                          "draft is corrupt or incomplete: retrain or re-copy it.") from None
    tensors = restored_tensors(tensors, key, path, "parallel draft")
    check_artefact_values({}, tensors, key, path, "parallel draft")
    masks = tensors.get(MASKS)
    if masks is None or masks.dim() != 2 or masks.shape[0] + 1 != int(record.get("k", -1)):
        raise ConfigError(f"{key}={str(path)!r}: {WEIGHTS} holds no {MASKS} for k={record.get('k')}; "
                          "the files do not belong together: retrain or re-copy it.")
    return record, tensors


def base_dir(record: dict, shipped: Path, path, key: str = "drafter.path") -> Path:
    """The base distilled draft a parallel draft was trained on, checked unchanged since."""
    base = Path(record["base"]["path"]).expanduser() if record["base"].get("path") else shipped
    if not base.is_dir() or weights_digest(base) != record["base"].get("sha256"):
        raise ConfigError(f"{key}={str(path)!r} was trained on the distilled draft {str(base)!r}, which is missing "
                          "or has changed since; retrain with `spec-zoo-train parallel` on the draft you have.")
    return base


@torch.no_grad()
def apply_updates(lm: torch.nn.Module, tensors: dict[str, torch.Tensor], key: str, path) -> None:
    """Add each update of ``tensors`` to the weight of ``lm`` it names (W += up @ down, or W += delta)."""
    weights = dict(lm.named_parameters())
    for name in sorted(n[: -len(".delta")] for n in tensors if n.endswith(".delta")):
        weight, delta = weights.get(name), tensors[f"{name}.delta"]
        if weight is None or tuple(delta.shape) != tuple(weight.shape):
            raise ConfigError(f"{key}={str(path)!r}: its change of {name} does not fit the base draft; "
                              "the files do not belong together: retrain or re-copy it.")
        weight.add_(delta.to(weight.dtype))
    for name in sorted(n[: -len(".up")] for n in tensors if n.endswith(".up")):
        weight, up, down = weights.get(name), tensors[f"{name}.up"], tensors.get(f"{name}.down")
        if weight is None or down is None or (up.shape[0], down.shape[1]) != tuple(weight.shape):
            raise ConfigError(f"{key}={str(path)!r}: its update of {name} does not fit the base draft; "
                              "the files do not belong together: retrain or re-copy it.")
        weight.add_((up.to(torch.float64) @ down.to(torch.float64)).to(weight.dtype))
