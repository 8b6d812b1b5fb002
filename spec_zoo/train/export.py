"""``spec-zoo-train export``: a draft head written in a published layout (conf/train_export.yaml).

The engines that serve speculative decoding at scale read their own layouts, not spec-zoo's
artefacts. ``medusa`` writes spec-zoo's Medusa heads in FasterDecoding's layout
(`spec_zoo.drafters.medusa.formats`); ``eagle3`` / ``speculators`` write an EAGLE-3 head in
either of its layouts (`spec_zoo.drafters.eagle.formats`), which converts one into the other.
spec-zoo's own EAGLE head is refused with the reason: it reads the target's last-layer state
through a unit-RMS ``fc`` into one normalised block input, and the EAGLE-3 layout (three
layers' states, embedding and feature normalised apart) cannot express that function.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError

FORMATS = ("medusa", "eagle3", "speculators")


def verifier_path(cfg: DictConfig) -> str:
    """What an exported head names as its verifier: a directory the engines (and `speculators`,
    which reads its config) can load. For an embedded target that is its converted safetensors
    copy (the de-quantized GGUF the head was trained on, not the hub's weights), made by the
    first spec-zoo run that loads it."""
    from spec_zoo.models import EMBEDDED, converted_dir

    if cfg.target.path:
        return str(cfg.target.path)
    name = str(cfg.target.name)
    return str(converted_dir(name)) if name in EMBEDDED else name


def export(cfg: DictConfig, target=None) -> Path:
    """Write ``cfg.export.source`` in layout ``cfg.export.format`` to ``cfg.export.out``."""
    from spec_zoo.artefacts import check_out_dir
    from spec_zoo.drafters.eagle.formats import load_published, save_eagle3, sniff
    from spec_zoo.drafters.medusa.drafter import SHIPPED
    from spec_zoo.drafters.medusa.formats import save_medusa
    from spec_zoo.drafters.medusa.heads import load_medusa
    from spec_zoo.train.loop import load_teacher_target

    e = cfg.export
    fmt, source = str(e.format), e.source
    if fmt not in FORMATS:
        raise ConfigError(f"export.format={fmt!r}; use one of {', '.join(FORMATS)}.")
    dtype = getattr(torch, str(e.dtype), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"export.dtype={e.dtype!r}; use float16, bfloat16 or float32.")
    if fmt != "medusa":
        found = sniff(source, "export.source") if source is not None else "spec_zoo"
        if found not in ("eagle3", "speculators"):
            raise ConfigError(
                f"export.format={fmt} needs export.source= an EAGLE-3 head (eagle3 or speculators layout), not a "
                f"{found} head: spec-zoo's EAGLE head reads the target's last-layer state through a unit-RMS fc into "
                "one normed block input, which the EAGLE-3 layout cannot express (docs/formats.md); --format medusa "
                "exports spec-zoo's Medusa heads.")
    # before the target loads (seconds to minutes); the writer checks again when it writes
    check_out_dir(e.out, "config.json", "Medusa layout" if fmt == "medusa" else f"{fmt} layout", "export.out")
    target = target if target is not None else load_teacher_target(cfg)
    model = target.model
    if fmt == "medusa":
        if source is not None and sniff(source, "export.source") != "spec_zoo":
            raise ConfigError(f"export.source={source!r} is not a spec-zoo Medusa-heads dir (`spec-zoo-train medusa`, "
                              "medusa.json); null exports the shipped heads.")
        heads = load_medusa(source or SHIPPED, model)
        return save_medusa(heads, e.out, int(model.lm_head.weight.shape[0]), cfg.target.name, dtype)
    head = load_published(source, model, found, key="export.source")
    return save_eagle3(head, e.out, fmt, verifier=verifier_path(cfg), dtype=dtype)
