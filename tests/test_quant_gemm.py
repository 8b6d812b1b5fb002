"""Linear layers at their own width (`spec_zoo.runtime.quant_gemm`): a GGUF-born weight's codes recovered
exactly, the float32 kernel equal to the skinny GEMM over the dequantized weights bit for bit, the
int8-activation kernel equal to its formula, rows bit-identical for any row count, and the model copy
that shares what it does not quantize. Small shapes; the kernel is built once per machine."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spec_zoo.errors import ConfigError
from spec_zoo.runtime import quant_gemm
from spec_zoo.runtime.quant_gemm import GROUP, KERNEL_ROWS, QuantLinear, dequantize, quantize, quantized_model, unpack
from spec_zoo.runtime.skinny_gemm import skinny_linear
from spec_zoo.testing import tiny_llama
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

# (K, N): one group, an odd number of groups (a kernel step's tail), a model's width and a tail of weight rows
SHAPES = [(32, 5), (96, 17), (576, 50), (160, 9)]
ROWS = list(range(1, 18)) + [23, 33]


@pytest.fixture(autouse=True, scope="module")
def built():
    quant_gemm.load()


def quant_linear(x, codes, scales, lows, bits):
    """The float32 op on GGUF-ordered codes, reordered for this machine's kernel first (as `QuantLinear` does)."""
    return torch.ops.spec_zoo.quant_linear(x, quant_gemm.kernel_codes(codes, bits), scales, lows, bits)


# each op on GGUF-ordered codes
OPS = {"float32": lambda: quant_linear, "int8": lambda: torch.ops.spec_zoo.quant_linear_q8}


def gguf_born(n: int, k: int, bits: int, seed: int = 0) -> torch.Tensor:
    """A float32 weight that a Q4_1 (bits 4) or Q8_0 (bits 8) file dequantizes to: float16 scales
    and lows, each group's codes spanning the range as llama.cpp's quantizer makes them (its min at
    0 and max at 15; its largest magnitude at 127), d * q + m rounded once."""
    g = torch.Generator().manual_seed(seed)
    scale = (torch.rand(n, k // GROUP, 1, generator=g) * 0.05 + 1e-3).half().float()
    if bits == 4:
        q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g).float()
        q[..., :2] = torch.tensor([0.0, 15.0])
        low = (-torch.rand(n, k // GROUP, 1, generator=g) * 0.4).half().float()
    else:
        q, low = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=g).float(), torch.zeros(n, k // GROUP, 1)
        q[..., 0] = 127.0
    return (q * scale + low).reshape(n, k)


def int8_formula(x: torch.Tensor, codes, scales, lows, bits: int) -> torch.Tensor:
    """quant_linear_q8's sums in float64: x rounded to int8 per group (scale max|x| / 127), integer
    dot products with the codes, each group's scales applied."""
    groups = x.reshape(len(x), -1, GROUP)
    amax = groups.abs().amax(-1)
    qx = torch.round(groups * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))[..., None]).double()
    dx = (amax / 127).double()
    q = unpack(codes, bits).double().reshape(codes.shape[0], -1, GROUP)
    dots = torch.einsum("mgk,ngk->mng", qx, q)
    return (dots * scales.double() * dx[:, None]).sum(-1) + (lows.double() * (dx * qx.sum(-1))[:, None]).sum(-1)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_gguf_born_weight_gets_its_own_codes_back(bits):
    weight = gguf_born(40, 96, bits)
    codes, scales, lows, exact = quantize(weight, bits)
    assert exact and torch.equal(dequantize(codes, scales, lows, bits), weight)
    again = quantize(dequantize(codes, scales, lows, bits), bits)
    assert all(torch.equal(a, b) for a, b in zip(again[:3], (codes, scales, lows)))


@pytest.mark.parametrize("bits", [4, 8])
def test_any_other_weight_is_quantized_and_said_to_be_another(bits):
    weight = torch.randn(40, 96)
    codes, scales, lows, exact = quantize(weight, bits)
    error = (dequantize(codes, scales, lows, bits) - weight).abs().reshape(40, -1, GROUP)
    assert not exact
    # each weight within half a step of its group's grid, plus what rounding the scale to float16 moves it
    assert (error <= scales[..., None] * 0.6).all()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n", SHAPES)
def test_the_float32_kernel_is_the_skinny_gemm_over_the_dequantized_weights(k, n, bits):
    torch.manual_seed(k + n)
    codes, scales, lows, _ = quantize(torch.randn(n, k), bits)
    x = torch.randn(max(ROWS), k)
    y = quant_linear(x, codes, scales, lows, bits)
    assert torch.equal(y, skinny_linear(x, dequantize(codes, scales, lows, bits)))
    assert torch.equal(quant_gemm.kernel_codes(quant_gemm.kernel_codes(codes, bits), bits, inverse=True), codes)


@pytest.mark.parametrize("activations", list(OPS))
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n", SHAPES)
def test_a_prompt_runs_the_dense_gemm_over_the_same_weights(k, n, bits, activations):
    """Past KERNEL_ROWS rows a float32 layer computes as the dense layer does, bit for bit, its weights
    dequantized in C++ (`dequantize`'s bits, from the kernel's order: runs of 4, 2 and 1 groups); up to
    it, and at int8 activations, on its kernel."""
    torch.manual_seed(k + n + bits)
    dense = nn.Linear(k, n, bias=False)
    dense.weight.data = gguf_born(n, k, bits, seed=k)
    layer, exact = QuantLinear.of(dense, bits, activations)
    assert exact and torch.equal(layer.dequantized(), dense.weight)
    prompt, step = torch.randn(1, KERNEL_ROWS + 1, k), torch.randn(1, KERNEL_ROWS, k)
    with torch.no_grad():
        assert torch.equal(layer(prompt), dense(prompt)) == (activations == "float32")
        assert torch.equal(layer(step), layer.op(step, layer.codes, layer.scales, layer.lows, bits))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n", SHAPES)
def test_the_int8_kernel_is_its_formula(k, n, bits):
    torch.manual_seed(k * n)
    codes, scales, lows, _ = quantize(torch.randn(n, k), bits)
    x = torch.randn(9, k) * torch.rand(9, k) * 3
    y = torch.ops.spec_zoo.quant_linear_q8(x, codes, scales, lows, bits)
    expected = int8_formula(x, codes, scales, lows, bits)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    # and it is x @ W^T up to the inputs' rounding to int8
    exact = x @ dequantize(codes, scales, lows, bits).T
    assert (y - exact).norm() <= 0.02 * exact.norm()


@pytest.mark.parametrize("activations", list(OPS))
@pytest.mark.parametrize("bits", [4, 8])
def test_rows_are_bit_identical_for_any_row_count(activations, bits):
    op = OPS[activations]()
    torch.manual_seed(bits)
    for k, n in SHAPES:
        codes, scales, lows, _ = quantize(torch.randn(n, k), bits)
        x = torch.randn(max(ROWS), k)
        alone = torch.cat([op(x[i:i + 1], codes, scales, lows, bits) for i in range(len(x))])
        assert [m for m in ROWS if not torch.equal(op(x[:m], codes, scales, lows, bits), alone[:m])] == [], (k, n)


@pytest.mark.parametrize("activations", list(OPS))
def test_threads_split_outputs_not_sums(activations):
    op = OPS[activations]()
    torch.manual_seed(3)
    codes, scales, lows, _ = quantize(torch.randn(300, 96), 4)
    x = torch.randn(5, 96)
    one = op(x, codes, scales, lows, 4)
    torch.set_num_threads(2)
    try:
        assert torch.equal(op(x, codes, scales, lows, 4), one)
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("activations", list(OPS))
def test_the_ops_have_fake_implementations_and_batch_dims(activations):
    codes, scales, lows, _ = quantize(torch.randn(29, 64), 4)
    x = torch.randn(1, 3, 64)
    op = getattr(torch.ops.spec_zoo, quant_gemm.ACTIVATIONS[activations])
    torch.library.opcheck(op.default, (x, codes, scales, lows, 4))
    layer = QuantLinear(codes, scales, lows, 4, activations=activations)
    assert layer(x).shape == (1, 3, 29)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), layer(x))


def test_bad_widths_and_shapes_are_refused_by_name():
    with pytest.raises(ConfigError, match="4 or 8 bits"):
        quantize(torch.randn(4, 64), 3)
    with pytest.raises(ConfigError, match="groups of 32"):
        quantize(torch.randn(4, 48), 4)
    with pytest.raises(ConfigError, match="float32 or int8"):
        quantized_model(nn.Linear(32, 4), activations="bf16")
    codes, scales, lows, _ = quantize(torch.randn(4, 64), 4)
    with pytest.raises(RuntimeError, match="codes must be"):
        torch.ops.spec_zoo.quant_linear(torch.randn(1, 96), codes, scales, lows, 4)


def test_the_copy_quantizes_the_linears_and_shares_the_rest():
    """A float32 model's copy: every linear with whole groups quantized (the output layer at its own
    width), the embeddings and norms the original's tensors, the original untouched; a GGUF-born
    model's layers are exact and its copy computes what it computes."""
    model = tiny_llama(0, vocab=64, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                n, k = module.weight.shape
                module.weight.copy_(gguf_born(n, k, 8 if module is model.lm_head else 4, seed=n + k))
    copy, layers, exact = quantized_model(model, bits=4, head_bits=8)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert layers == exact == len(linears) and all(isinstance(m, nn.Linear) for m in model.modules()
                                                   if type(m).__name__.endswith("Linear"))
    quantized = [m for m in copy.modules() if isinstance(m, QuantLinear)]
    assert len(quantized) == len(linears) and copy.lm_head.bits == 8 and quantized[0].bits == 4
    assert copy.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert copy.model.norm.weight is model.model.norm.weight
    ids = torch.tensor([[3, 9, 27, 17, 5]])
    with torch.no_grad():
        torch.testing.assert_close(copy(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_bias_is_the_originals_added_after():
    linear = nn.Linear(64, 6)
    layer, _ = QuantLinear.of(linear, 4)
    x = torch.randn(2, 64)
    assert layer.bias is linear.bias
    assert torch.equal(layer(x), torch.ops.spec_zoo.quant_linear(x, layer.codes, layer.scales, layer.lows, 4)
                       + linear.bias)
