"""The AMX GEMM (`spec_zoo.runtime.amx_gemm`): bf16 rows bit-identical for any row count, the product it
computes, the custom op's fake implementation, the compiled runtime on it (rows and tree nodes exact),
and its refusals. Runs where the CPU has AMX-BF16 (Xeon since Sapphire Rapids); elsewhere the AMX
tests skip with the reason and only the refusals run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.runtime import CompiledTarget, amx_gemm
from spec_zoo.testing import PROMPT, sampling_model
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)


def has_amx() -> bool:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return "amx_bf16" in flags.split()


needs_amx = pytest.mark.skipif(not has_amx(), reason="this CPU has no AMX-BF16 (the matrix engine the kernel runs on)")

# (K, N): K with and without a tail past a 32-wide tile, N short of a 64-column group and past several;
# the target's own shapes (576 -> 1536, 1536 -> 576, the 3 KV heads' 192)
SHAPES = [(19, 7), (40, 29), (64, 130), (576, 192), (1536, 576)]
ROWS = [*range(1, 18), 31, 32, 33, 64]


def rows_that_differ(x: torch.Tensor, weight: torch.Tensor) -> list[int]:
    """The row counts M at which the first M rows of ``x`` get other bits than each row alone."""
    alone = torch.cat([amx_gemm.amx_linear(x[i:i + 1], weight) for i in range(len(x))])
    return [m for m in ROWS if not torch.equal(amx_gemm.amx_linear(x[:m], weight), alone[:m])]


@needs_amx
@pytest.mark.parametrize("k,n", SHAPES)
def test_rows_are_bit_identical_for_any_row_count(k, n):
    torch.manual_seed(k + n)
    x, weight = torch.randn(max(ROWS), k).to(torch.bfloat16), torch.randn(n, k).to(torch.bfloat16)
    assert rows_that_differ(x, weight) == []


@needs_amx
def test_it_is_x_times_w_transposed_summed_in_float32():
    """The bf16 product of exact float32 sums, rounded once: within a bf16 rounding of the float64 product."""
    torch.manual_seed(3)
    x, weight = torch.randn(20, 576).to(torch.bfloat16), torch.randn(300, 576).to(torch.bfloat16)
    exact = x.double() @ weight.double().T
    ours = amx_gemm.amx_linear(x, weight)
    assert ours.dtype == torch.bfloat16 and ours.shape == (20, 300)
    torch.testing.assert_close(ours.double(), exact, rtol=2 ** -8, atol=1e-3)


@needs_amx
def test_threads_split_outputs_not_sums():
    torch.manual_seed(1)
    x, weight = torch.randn(9, 576).to(torch.bfloat16), torch.randn(1000, 576).to(torch.bfloat16)
    one = amx_gemm.amx_linear(x, weight)
    torch.set_num_threads(2)
    try:
        assert torch.equal(amx_gemm.amx_linear(x, weight), one)
    finally:
        torch.set_num_threads(1)


@needs_amx
def test_the_op_has_a_fake_implementation():
    amx_gemm.load()
    weight = torch.randn(40, 64).to(torch.bfloat16)
    x = torch.randn(3, 64).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.spec_zoo.amx_linear.default, (x, amx_gemm.pack(weight, *amx_gemm.load()), 40))


@needs_amx
def test_the_compiled_runtime_on_it_keeps_rows_and_tree_nodes_exact():
    """model.gemm=amx in bfloat16 with the attention kernel (no eager fallback): row 0 is bit-identical
    for 1..17 scored tokens, every tree node equals its path as a chain, and every row of a chain
    equals plain decoding's row once the chain's tokens before it are committed."""
    target = CompiledTarget(sampling_model().to(torch.bfloat16), max_cache_len=64, buckets=(2, 4), key_block=16,
                            gemm="amx", fallback=False)
    target.reset()
    alone = target.score(PROMPT, Draft.empty()).logits[0]
    differ = []
    for m in range(1, 17):
        target.reset()
        if not torch.equal(target.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits[0], alone):
            differ.append(m + 1)
    assert differ == []
    draft = Draft(torch.tensor([5, 2, 6, 3, 4, 7]), [-1, -1, 0, 0, 2, 1])
    target.reset()
    logits = target.score(PROMPT, draft).logits
    for node in range(len(draft)):
        target.reset()
        chain = target.score(PROMPT, Draft.chain(draft.tokens[draft.path_to(node)])).logits[-1]
        assert torch.equal(logits[node + 1], chain), f"node {node}"
    chain = [3, 1, 4, 1, 5, 2, 6, 0, 7, 2, 2, 5]
    target.reset()
    rows = target.score(PROMPT, Draft.chain(chain)).logits
    target.reset()
    assert [i for i in range(len(chain) + 1)
            if not torch.equal(target.score(PROMPT + chain[:i], Draft.empty()).logits[0], rows[i])] == []


def test_amx_on_a_float32_model_is_refused_not_ignored():
    """Its kernel computes in bf16 only: on a float32 model it would run none of the linears."""
    with pytest.raises(ConfigError, match=r"model.gemm=amx computes in bfloat16, but the model is float32; set "
                                          r"model.dtype=bfloat16 or model.gemm=inductor"):
        CompiledTarget(sampling_model().float(), max_cache_len=64, gemm="amx")


def test_a_cpu_without_amx_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(amx_gemm, "build", lambda *a: None)
    monkeypatch.setattr(torch.ops.spec_zoo, "amx_available", lambda: False, raising=False)
    monkeypatch.setattr(torch.library, "register_fake", lambda name: (lambda fn: fn))
    with pytest.raises(ConfigError, match="AMX-BF16.*set model.gemm=inductor"):
        amx_gemm.load.__wrapped__()
