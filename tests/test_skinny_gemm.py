"""The skinny GEMM (`spec_zoo.runtime.skinny_gemm`): rows bit-identical for any row count, the custom op's
fake implementation, the linear-layer routing, and its errors. Small shapes, no compiling except
one tiny graph; the kernel is built once per machine (cached under the spec-zoo cache)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spec_zoo.errors import ConfigError
from spec_zoo.runtime import skinny_gemm
from spec_zoo.runtime.skinny_gemm import SkinnyLinears, skinny_linear
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

# (K, N): K with and without a tail past the SIMD width, N past whole weight blocks and short of one
SHAPES = [(19, 7), (40, 29), (64, 50), (72, 26)]
ROWS = list(range(1, 17)) + [23, 33]


def rows_that_differ(linear, x: torch.Tensor, weight: torch.Tensor) -> list[int]:
    """The row counts M at which ``linear`` gives any of the first M rows of ``x`` other bits than
    it gives that row alone (M = 1): the runtime's batch-invariance contract, checked exactly."""
    alone = torch.cat([linear(x[i:i + 1], weight) for i in range(len(x))])
    return [m for m in ROWS if m <= len(x) and not torch.equal(linear(x[:m], weight), alone[:m])]


@pytest.mark.parametrize("k,n", SHAPES)
def test_rows_are_bit_identical_for_any_row_count(k, n):
    torch.manual_seed(k * n)
    x, weight = torch.randn(max(ROWS), k), torch.randn(n, k)
    assert rows_that_differ(skinny_linear, x, weight) == []
    torch.testing.assert_close(skinny_linear(x, weight), x @ weight.T)  # and it is x @ W^T


def test_the_invariance_check_catches_an_order_changing_variant():
    """A GEMM that sums K in two halves once more than 4 rows come (as a blocked kernel might) is
    caught: the check can fail."""
    k = 64

    def split_past_four(x, weight):
        if len(x) <= 4:
            return skinny_linear(x, weight)
        return skinny_linear(x[:, : k // 2], weight[:, : k // 2]) + skinny_linear(x[:, k // 2:], weight[:, k // 2:])

    torch.manual_seed(0)
    x, weight = torch.randn(16, k), torch.randn(50, k)
    assert rows_that_differ(split_past_four, x, weight) == [m for m in ROWS if 4 < m <= 16]


def test_threads_split_outputs_not_sums():
    torch.manual_seed(1)
    x, weight = torch.randn(9, 72), torch.randn(300, 72)
    one = skinny_linear(x, weight)
    torch.set_num_threads(2)
    try:
        assert torch.equal(skinny_linear(x, weight), one)
    finally:
        torch.set_num_threads(1)


def test_the_op_has_a_fake_implementation_and_batch_dims():
    x, weight = torch.randn(1, 3, 40), torch.randn(29, 40)
    packed = skinny_gemm.pack(weight, *skinny_gemm.layout())
    torch.library.opcheck(torch.ops.spec_zoo.skinny_linear.default, (x, packed, 29))
    assert skinny_linear(x, weight).shape == (1, 3, 29)


def test_linear_layers_route_to_it_inside_a_compiled_graph():
    """Under `SkinnyLinears` a bias-free float32 linear is the op (eager and compiled alike, bit
    for bit); a linear with a bias runs as before."""
    torch.manual_seed(2)
    x, weight, bias = torch.randn(1, 5, 40), torch.randn(29, 40), torch.randn(29)
    with SkinnyLinears():
        routed = F.linear(x, weight)
        compiled = torch.compile(lambda a: F.linear(a, weight), fullgraph=True, dynamic=True)(x)
        with_bias = F.linear(x, weight, bias)
    assert torch.equal(routed, skinny_linear(x, weight))
    assert torch.equal(compiled, routed)
    assert torch.equal(with_bias, F.linear(x, weight, bias))


def test_no_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ConfigError, match="model.gemm=inductor"):
        skinny_gemm.load.__wrapped__()


def test_each_gemm_prices_with_a_cost_table_of_its_own():
    """The GEMMs have different t(M) curves: a table measured on one never prices another."""
    from types import SimpleNamespace

    from spec_zoo.costs import table_path

    config = SimpleNamespace(model_type="llama", num_hidden_layers=2, hidden_size=8)
    paths = {gemm: table_path(SimpleNamespace(config=config, vocab_size=10, runtime="compiled", dtype=torch.float32,
                                              gemm=gemm)).name for gemm in ("skinny", "inductor", "amx")}
    assert "-compiled-skinny-float32-" in paths["skinny"] and "-compiled-float32-" in paths["inductor"]
    assert "-compiled-amx-float32-" in paths["amx"]
