"""The batch-invariant skinny GEMM: ``spec_zoo::skinny_linear``, a custom op for x @ W^T with few rows.

Inductor's C++ GEMM is flat only to 4 scored rows on a CPU (docs/runtime.md says why); this
kernel (`skinny_gemm.cpp`) reads each weight once per call, reuses it from L1 for every row,
and reduces each output over K in one fixed order whatever the row count, so rows stay
bit-identical for any M (the compiled runtime's invariance contract). It is C++ built on
first use for this CPU (-march=native: AVX-512, AVX2 or a portable path), cached under
`spec_zoo.paths.cache_root` / ``kernels``, and registered with `torch.library` (a fake
implementation included) so inductor calls it inside the compiled graph.
`SkinnyLinears` routes the float32, bias-free linear layers of a traced model to it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from spec_zoo.runtime.cpp_kernels import RoutedLinears, build


@functools.cache
def load() -> str:
    """Build (once per machine, then cached) and load the kernel; the ISA it was built for."""
    build("skinny_gemm.cpp", "model.gemm=skinny", "set model.gemm=inductor")

    @torch.library.register_fake("spec_zoo::skinny_linear")
    def _(x, packed, n):  # shapes for the compiler: x [..., K] -> [..., N]
        return x.new_empty((*x.shape[:-1], n))

    return torch.ops.spec_zoo.skinny_isa()


@functools.cache
def layout() -> tuple[int, int]:
    """(SIMD lanes, weight rows per block) of this machine's build."""
    load()
    lanes, block = torch.ops.spec_zoo.skinny_layout()
    return lanes, block


def pack(weight: torch.Tensor, lanes: int, block: int) -> torch.Tensor:
    """The weight [N, K] as the kernel streams it (``lanes, block = layout()``): [ceil(N / block),
    ceil(K / lanes), block, lanes], zero-padded. Plain tensor ops, so on frozen weights inductor
    folds them into a constant once."""
    n, k = weight.shape
    padded = F.pad(weight, (0, -k % lanes, 0, -n % block))
    blocks = padded.reshape(padded.shape[0] // block, block, padded.shape[1] // lanes, lanes)
    return blocks.permute(0, 2, 1, 3).contiguous()


def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T, float32, rows batch-invariant (builds the kernel on first call)."""
    packed = pack(weight, *layout())  # layout() first: it loads the op
    return torch.ops.spec_zoo.skinny_linear(x, packed, weight.shape[0])


class SkinnyLinears(RoutedLinears):
    """While active (and while dynamo traces under it), ``F.linear`` on float32 weights without a
    bias runs `skinny_linear`; any other linear runs as it would."""

    def __init__(self):
        lanes, block = layout()  # plain ints, read before dynamo traces (it must not trace the build)
        super().__init__(torch.float32, lambda x, weight: torch.ops.spec_zoo.skinny_linear(
            x, pack(weight, lanes, block), weight.shape[0]))
