"""The engine: how the target (and a compiled draft) runs, apart from the strategies that draft and verify.

Here: the eager `target.Target` and the model's own layers it runs (`layers`), the compiled runtime
(`compiled.CompiledTarget`) and the compiled heads (`compiled_head`, `compiled_module`), their cache of
graphs (`compile_cache`), the C++ kernels (`cpp_kernels` builds them: the GEMMs `skinny_gemm`, `amx_gemm`,
the weight-width GEMM `quant_gemm`, `attention_kernel`) and `host_fit`, which picks the ``auto`` settings.
The loop, the registry and the drafters' shared parts sit one folder up (docs/architecture.md).

The compiled runtime's names below load on first use (PEP 562): importing `target` or a kernel does not
load the compiled runtime (about a second of imports an eager run never needs)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["DEFAULT_BUCKETS", "GEMMS", "CompiledTarget", "PackedWrites", "SlotCache", "slot_mask"]

if TYPE_CHECKING:
    from spec_zoo.runtime.compiled import DEFAULT_BUCKETS, GEMMS, CompiledTarget, PackedWrites, SlotCache, slot_mask


def __getattr__(name: str):
    """A name of `compiled`, imported now."""
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.compiled"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
