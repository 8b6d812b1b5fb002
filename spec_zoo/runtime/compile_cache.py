"""Compiled graphs reused across processes: inductor's FX graph cache, keyed by the weights.

The compiled runtime freezes the weights (the C++ micro-GEMM needs constant weights) and
inductor then packs every linear's weight into an MKL-DNN tensor. Inductor's FX graph
cache refuses any graph holding such a tensor ("mkldnn tensors unpickleable": it hashes
constants by value and cannot read those), and AOTAutograd's cache refuses frozen graphs,
so every process compiled for ~73 s. The packed tensors never reach the cache entry (the
C++ GEMM replaces them by its own dense blocked copies, which are stored), so only the
*key* needs them: `cached_compile` hashes them by dtype and shape, as inductor already does
for frozen parameters, and puts a fingerprint of the weights' values into the key
(``torch.compiler.config.cache_key_tag``) in their place. Another model of the same shape
then misses instead of reading the first one's packed weights.

What still runs on a hit: dynamo's trace, AOTAutograd and the freezing passes (seconds);
what is skipped: lowering, GEMM autotuning and the C++ compiles. Inductor's cache lives
under `spec_zoo.paths.cache_root` (``inductor/``) unless ``TORCHINDUCTOR_CACHE_DIR`` is set.
The two patched hooks are inductor internals of the pinned torch; if they move,
`cached_compile` compiles uncached (as before) instead of failing.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager, nullcontext
from unittest import mock

import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

from spec_zoo.paths import cache_root


def fingerprint(module: torch.nn.Module) -> str:
    """A digest of every parameter's and buffer's name, dtype, shape and values (~1 s per GB)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().data if tensor.numel() else b"")  # read, not copied
    return digest.hexdigest()


def inductor_cache_dir() -> str:
    """``TORCHINDUCTOR_CACHE_DIR`` if the user set it, else ``<cache_root>/inductor``."""
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(cache_root() / "inductor")


def _packed_weights_by_shape():
    """Inductor's FX-graph-cache hooks, changed to key an MKL-DNN tensor by dtype and shape
    (its values are in the fingerprint); None where this torch has other hooks."""
    try:
        from torch._inductor.codecache import CacheabilityValidator, FxGraphCachePickler
    except ImportError:
        return None
    reduce_tensor = getattr(FxGraphCachePickler, "_reduce_tensor", None)
    if reduce_tensor is None or not hasattr(CacheabilityValidator, "check_tensor"):
        return None

    def by_shape(self, t):
        if t.is_mkldnn:
            return str, (f"mkldnn {t.dtype} {tuple(t.shape)}",)
        return reduce_tensor(self, t)

    def check_tensor(t):  # the only refusal in the original is of MKL-DNN tensors
        return None

    return (mock.patch.object(FxGraphCachePickler, "_reduce_tensor", by_shape),
            mock.patch.object(CacheabilityValidator, "check_tensor", staticmethod(check_tensor)))


@contextmanager
def cached_compile(weights_tag: str):
    """Compile (the first call of a ``torch.compile``d function) inside this block to read and
    write the FX graph cache under `inductor_cache_dir`, keyed by ``weights_tag`` (`fingerprint`).
    Yields a dict whose ``"hit"`` says, after the block, whether the graph came from the cache."""
    report = {"hit": False}
    hooks = _packed_weights_by_shape()
    before = counters["inductor"]["fxgraph_cache_hit"]
    with (
        mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}),
        torch.compiler.config.patch(cache_key_tag=weights_tag),  # type: ignore[attr-defined]  # added at import
        inductor_config.patch(fx_graph_cache=True),
        hooks[0] if hooks else nullcontext(),
        hooks[1] if hooks else nullcontext(),
    ):
        yield report
    report["hit"] = counters["inductor"]["fxgraph_cache_hit"] > before
