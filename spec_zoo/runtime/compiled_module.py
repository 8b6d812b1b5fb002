"""`CompiledModule`: a draft module that keeps no cache (Medusa's heads) as one compiled graph.

Medusa's heads read one target state and keep nothing between steps: K residual blocks, one
product over the draft vocabulary and the scatter into the target's vocabulary. Eagerly that
is a dozen PyTorch ops, each paying its per-op overhead; compiled as the target is
(`spec_zoo.runtime.compiled`: frozen weights, inductor's C++ GEMM) they are one graph on one input
shape, compiled once per process and read from inductor's on-disk cache by later processes
(`spec_zoo.runtime.compile_cache`). The graph has one row and no cache, so there is no batch
invariance to keep: it computes the same logits every call for the same state.
"""

from __future__ import annotations

import torch

from spec_zoo.runtime.compile_cache import fingerprint
from spec_zoo.runtime.compiled import compile_graph, inductor_settings, rowwise_run


class CompiledModule:
    """``fn(x)`` over ``module``'s weights as one compiled graph for inputs shaped like
    ``example`` (every call must pass that shape).

    what:   the graph's name in progress lines ("the Medusa heads").
    key:    the config key named in errors and in the eager fallback's warning.
    """

    runtime = "compiled"

    def __init__(self, module: torch.nn.Module, fn, example: torch.Tensor, what: str, key: str = "drafter",
                 freezing: bool = True, gemm_backends: str = "CPP", fallback: bool = True):
        self.module, self.fn, self.example, self.what, self.key = module, fn, example, what, key
        self.settings, self.fallback = inductor_settings(freezing, gemm_backends), fallback
        self._compiled = None
        self.compile_s: float | None = None
        self.compile_cached = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.example.shape or x.dtype != self.example.dtype:
            raise ValueError(f"{self.what}' graph was compiled for {tuple(self.example.shape)} {self.example.dtype} "
                             f"inputs, not {tuple(x.shape)} {x.dtype}")
        return self._graph()(x)

    def _graph(self):
        if self._compiled is None:
            def under(fn):  # inductor's settings; no attention to make row-wise
                return rowwise_run(fn, [], self.settings)

            graph, self.compile_s, self.compile_cached = compile_graph(
                self.fn, under, (self.example,), fingerprint(self.module), self.what, self.key, self.fallback)
            self._compiled = graph
        return self._compiled

    def warm_up(self) -> float:
        """Compile now, before anything is timed; the seconds it took."""
        self._graph()
        assert self.compile_s is not None  # set by the compile
        return self.compile_s
