"""The compiled runtime's attention as one C++ kernel: ``spec_zoo::rowwise_attention``.

Inductor compiles `spec_zoo.runtime.compiled.rowwise_attention`'s formula into loops that re-read every
key for every query row, each sum one dependent chain: at 1,500 cached tokens attention cost more
than the weights, and it grew with every scored row. This kernel (`attention_kernel.cpp`) reads a
block of keys once for all the query rows of its KV head and keeps each row's sums in one fixed
order, so rows stay bit-identical for any M and a tree node equals its chain path (the runtime's
contract). Built on first use for this CPU (`spec_zoo.runtime.cpp_kernels`), registered with
`torch.library` with a fake implementation, so inductor calls it inside the compiled graph.
``model.attention`` picks it (``kernel``: float32, or bfloat16 with float32 sums) or inductor's loops
(``inductor``).
"""

from __future__ import annotations

import functools

import torch

from spec_zoo.runtime.cpp_kernels import build

ATTENTIONS = ("kernel", "inductor")  # model.attention
DEFAULT_ATTENTION = "kernel"


@functools.cache
def load() -> str:
    """Build (once per machine, then cached) and load the kernel; the ISA it was built for."""
    build("attention_kernel.cpp", "model.attention=kernel", "set model.attention=inductor")

    @torch.library.register_fake("spec_zoo::rowwise_attention")
    def _(query, key, value, mask, draft_slots, draft_mask, scaling, softcap, row_cache=None):  # query's shape
        return query.new_empty(query.shape)

    return torch.ops.spec_zoo.attention_isa()


def attend(query, key, value, attention_mask, scaling: float, draft_slots, draft_mask, softcap=None, row_cache=None):
    """`spec_zoo.runtime.compiled.rowwise_attention`'s contract on the kernel: [B, H, M, D] out, in query's dtype."""
    return torch.ops.spec_zoo.rowwise_attention(query, key, value, attention_mask, draft_slots, draft_mask,
                                                float(scaling), float(softcap or 0.0), row_cache)
