"""The batch-invariant bf16 GEMM on the matrix engine: ``spec_zoo::amx_linear``, x @ W^T on AMX tiles.

Inductor's bf16 linears run on the vector units (its AMX micro-GEMM needs max-autotune and
then may still pick ATen per shape), so compiled bf16 scoring grows steeply with the row count;
oneDNN's AMX kernels are flat to ~32 rows but promise no reproducibility across M. This kernel
(`amx_gemm.cpp`) runs every row through 16-row AMX tiles whose per-element arithmetic does not
depend on the other rows, so rows are bit-identical for any M (the compiled runtime's invariance
contract), and reads each weight once per call: scoring 32 rows costs about what one does.
Built on first use for this CPU like the skinny GEMM (`spec_zoo.runtime.cpp_kernels`); `AmxLinears`
routes the bf16, bias-free linear layers of a traced model to it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from spec_zoo.errors import ConfigError
from spec_zoo.runtime.cpp_kernels import RoutedLinears, build


@functools.cache
def load() -> tuple[int, int, int]:
    """Build (once per machine, then cached) and load the kernel; its (group, k, n) tile layout.
    A CPU without AMX-BF16, or a kernel that refuses its tile state, is a `ConfigError`."""
    build("amx_gemm.cpp", "model.gemm=amx", "set model.gemm=inductor")

    @torch.library.register_fake("spec_zoo::amx_linear")
    def _(x, packed, n):  # shapes for the compiler: x [..., K] -> [..., N]
        return x.new_empty((*x.shape[:-1], n))

    if not torch.ops.spec_zoo.amx_available():
        raise ConfigError("model.gemm=amx runs on Intel's matrix engine (AMX-BF16), which this CPU (or its kernel) "
                          "does not offer; set model.gemm=inductor.")
    group, k, n = torch.ops.spec_zoo.amx_layout()
    return group, k, n


def pack(weight: torch.Tensor, group: int, k: int, n: int) -> torch.Tensor:
    """The weight [N, K] as the kernel streams it (``load()``'s layout): [ceil(N / (n group)),
    ceil(K / k), group, k / 2, n, 2], zero-padded, bf16. Plain tensor ops, so on frozen weights
    inductor folds them into a constant once."""
    rows, cols = weight.shape
    padded = F.pad(weight.to(torch.bfloat16), (0, -cols % k, 0, -rows % (n * group)))
    blocks = padded.reshape(padded.shape[0] // (n * group), group, n, padded.shape[1] // k, k // 2, 2)
    return blocks.permute(0, 3, 1, 4, 2, 5).contiguous()


def amx_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T in bfloat16 on AMX, rows batch-invariant (builds the kernel on first call)."""
    packed = pack(weight, *load())  # load() first: it registers the op
    return torch.ops.spec_zoo.amx_linear(x, packed, weight.shape[0])


class AmxLinears(RoutedLinears):
    """While active (and while dynamo traces under it), ``F.linear`` on bf16 weights without a bias
    runs `amx_linear`; any other linear runs as it would."""

    def __init__(self):
        layout = load()  # plain ints, read before dynamo traces (it must not trace the build)
        super().__init__(torch.bfloat16,
                         lambda x, weight: torch.ops.spec_zoo.amx_linear(x, pack(weight, *layout), weight.shape[0]))
