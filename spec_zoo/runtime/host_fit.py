"""``model.dtype``, ``model.weights`` and ``model.runtime`` = ``auto``: the target as fast as this host
runs it without changing the model, so a bare ``spec-zoo`` needs no knowledge of runtimes or widths.

- dtype: float32 on the CPU (the weights' own arithmetic; bfloat16 is another arithmetic, asked for by
  name), on a GPU bfloat16 where it computes it, else float16.
- weights: ``native`` where every linear layer is stored as 4- or 8-bit codes (the embedded SmolLM2: the
  same model at a fifth of the bytes, `spec_zoo.runtime.quant_gemm`), else ``dense``.
- runtime: ``compiled`` when this target's graph is in inductor's cache (a compile leaves a note beside it:
  `spec_zoo.runtime.CompiledTarget.graph_note`), else ``eager``, saying how to compile it once.

What each became is named in the run's summary line (`spec_zoo.api.label`).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target

PROBE_ROWS = 4  # rows of each linear layer a width is tried on before the whole model is converted


def fit_dtype(dtype: str, device: str) -> str:
    """``dtype`` as given, or for ``auto`` what fits ``device`` (``cpu`` or ``cuda``, resolved)."""
    if dtype != "auto":
        return dtype
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def fit_weights(model: nn.Module, key: str = "model") -> tuple[str, nn.Module]:
    """(``native``, the model at it) when every linear layer is 4- or 8-bit codes exactly (a GGUF's Q4_1 /
    Q8_0), the kernel builds and the model computes in float32 on the CPU; else (``dense``, ``model``).
    Each layer's first rows are tried before any whole layer is converted: a float model costs nothing."""
    from spec_zoo.runtime.quant_gemm import GROUP, at_width, quantize

    parameter = next(model.parameters())
    if parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        return "dense", model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.in_features % GROUP == 0]
    if not linears or not all(any(quantize(m.weight[:PROBE_ROWS], bits)[3] for bits in (4, 8)) for m in linears):
        return "dense", model
    try:
        return "native", at_width(model, "native", key)  # builds the kernel (once per machine) first
    except ConfigError:  # no compiler, or a layer whose later rows no width holds
        return "dense", model


def fit_runtime(model, tokenizer, compiled: dict) -> Target:
    """The compiled target (``compiled``: its settings) when a compile of its graph left its note, else the
    eager one with a line saying how to compile it; off the CPU, or in a dtype the compiled runtime does not
    compute, eager without a word."""
    from spec_zoo.runtime.compiled import CompiledTarget

    if model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16):
        return Target(model, tokenizer)
    if compiled_before(model, compiled):
        return CompiledTarget(model, tokenizer, **compiled)
    print("spec-zoo: model.runtime=auto runs eager: this target's compiled graph is not in the cache yet; "
          "`spec-zoo warmup` with the same model settings compiles it once (a minute or two), and later runs "
          "start compiled (model.runtime=eager stays eager and silences this).", file=sys.stderr, flush=True)
    return Target(model, tokenizer)


def compiled_before(model, compiled: dict) -> bool:
    """Whether a compile of ``CompiledTarget(model, **compiled)`` on this machine left its note."""
    from spec_zoo.runtime.compiled import graph_note

    return graph_note(model, compiled).exists()
