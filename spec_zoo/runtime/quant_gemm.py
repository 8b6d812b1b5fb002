"""Linear layers at their own width: ``spec_zoo::quant_linear``, x @ W^T from 4- or 8-bit codes.

The embedded targets are 4-bit models (SmolLM2 a Q4_1 GGUF, Gemma 3 a Q4_K_M) run as their float32
dequantization, so every step reads seven times the bytes the model holds. `QuantLinear` keeps a
linear layer as codes plus a float16-valued scale and low per 32 weights (w = d * q + m, GGUF's
Q4_1; Q8_0 at 8 bits) and computes from them (`quant_gemm.cpp`: dequantized in registers, float32
sums, rows bit-identical for any row count, the skinny GEMM's sums over the same weights).

`quantize` reproduces llama.cpp's reference quantizer, then moves each group's scale to the float16
neighbour that reproduces the group exactly where one does: weights that came from such a file get
their own codes back (`exact` says so) and the model is the same one; any other weights are
quantized, a different model, as llama.cpp would make it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from spec_zoo.errors import ConfigError
from spec_zoo.outputs import atomic_write
from spec_zoo.paths import cache_root
from spec_zoo.runtime.compile_cache import fingerprint
from spec_zoo.runtime.cpp_kernels import build

GROUP = 32  # weights per scale and low
BITS = (4, 8)
# how a QuantLinear's inputs enter the sums: float32 (the dequantized weights' float32 sums, the same model), or
# rounded to int8 per group of 32 and summed as integers (llama.cpp's Q8_1: a draft's arithmetic, several times
# the weights per instruction)
ACTIVATIONS = {"float32": "quant_linear", "int8": "quant_linear_q8"}


@functools.cache
def load() -> str:
    """Build (once per machine, then cached) and load the kernel; the ISA it was built for."""
    build("quant_gemm.cpp", "drafter=quantized", "install a C++ compiler or choose another drafter")

    for op in ("spec_zoo::quant_linear", "spec_zoo::quant_linear_q8"):
        @torch.library.register_fake(op)
        def _(x, codes, scales, lows, bits):  # shapes for the compiler: x [..., K] -> [..., N]
            return x.new_empty((*x.shape[:-1], codes.shape[0]))

    @torch.library.register_fake("spec_zoo::quant_weight")
    def _(codes, scales, lows, bits):  # [N, K]
        return scales.new_empty((codes.shape[0], scales.shape[1] * GROUP))

    return torch.ops.spec_zoo.quant_isa()


def _f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def _codes(groups: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, bits: int) -> torch.Tensor:
    """llama.cpp's rounding of each group's weights to codes for ``scale`` and ``low`` (float32 [.., G, 1])."""
    inverse = torch.where(scale == 0, torch.zeros_like(scale), 1.0 / scale)
    if bits == 4:
        return ((groups - low) * inverse + 0.5).trunc().clamp(0, 15)
    return (groups * inverse).round().clamp(-127, 127)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor, bits: int) -> torch.Tensor:
    """The float32 weight [N, K] of `quantize`'s output (d * q + m, one rounding)."""
    q = unpack(codes, bits).float().reshape(codes.shape[0], -1, GROUP)
    return (q * scales[..., None] + lows[..., None]).reshape(codes.shape[0], -1)


def unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes one per weight [N, K] (GGUF's nibble order at 4 bits: a group's byte b holds b and b + 16)."""
    if bits == 8:
        return codes
    n = codes.shape[0]
    grouped = codes.reshape(n, -1, GROUP // 2)
    return torch.cat([grouped & 15, grouped >> 4], dim=-1).reshape(n, -1)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """`unpack`'s inverse: uint8 nibbles at 4 bits, int8 at 8."""
    if bits == 8:
        return q.to(torch.int8)
    grouped = q.to(torch.uint8).reshape(q.shape[0], -1, GROUP)
    return (grouped[..., : GROUP // 2] | (grouped[..., GROUP // 2:] << 4)).reshape(q.shape[0], -1)


def kernel_codes(codes: torch.Tensor, bits: int, inverse: bool = False) -> torch.Tensor:
    """GGUF-ordered codes in the order ``quant_linear`` reads them on this machine (``inverse``: back):
    at 4 bits on AVX-512, each run of four groups' 64 bytes transposed as 4 x 16 -> 16 x 4 (byte 4l + j
    is group j's byte l: one load then holds every group's weights l and 16 + l in dword l), a run of
    two groups' 32 bytes as 2 x 16 -> 16 x 2, a last single group as it is (`quant_gemm.cpp`, run4)."""
    if bits != 4 or load() != "avx512":
        return codes
    return codes[:, _byte_order(codes.shape[1], inverse)].contiguous()


@functools.cache
def _byte_order(width: int, inverse: bool) -> torch.Tensor:
    """`kernel_codes`'s permutation of a row's ``width`` bytes (one index: a layer is reordered in one gather)."""
    groups = width // (GROUP // 2)
    runs = [4] * (groups // 4) + [2] * (groups % 4 // 2) + [1] * (groups % 2)  # as the kernel walks them
    parts, g = [], 0
    for run in runs:
        parts.append(torch.arange(g * 16, (g + run) * 16).reshape(run, 16).t().reshape(-1))
        g += run
    order = torch.cat(parts)
    return torch.argsort(order) if inverse else order


def quantize(weight: torch.Tensor, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(codes, scales, lows, exact) of a float weight [N, K] (K a multiple of 32): at 4 bits GGUF's Q4_1,
    at 8 bits its Q8_0; ``exact`` when the dequantized weight is ``weight`` bit for bit."""
    if bits not in BITS:
        raise ConfigError(f"bits={bits}: quantized weights are 4 or 8 bits wide.")
    n, k = weight.shape
    if k % GROUP:
        raise ConfigError(f"a linear layer of {k} inputs cannot be quantized in groups of {GROUP}.")
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    if bits == 4:
        raw, low = (hi - lo) / 15, _f16(lo)
    else:
        raw, low = w.abs().amax(-1, keepdim=True) / 127, torch.zeros_like(lo)
    best_scale, best_q = _f16(raw), _codes(w, raw, lo if bits == 4 else low, bits)
    missed = (best_q * best_scale + low != w).any(-1, keepdim=True)
    # a file's scale was rounded to float16 before its codes were taken from the float32 one: where the
    # rounded scale misses, try its float16 neighbours with codes rounded against each
    for step in (-1, 1, -2, 2):
        if not missed.any():
            break
        half = best_scale.to(torch.float16)
        bits16 = half.view(torch.int16) + step * torch.where(half < 0, -1, 1).to(torch.int16)
        scale = bits16.view(torch.float16).float()
        q = _codes(w, scale, low, bits)
        fits = missed & ~(q * scale + low != w).any(-1, keepdim=True)
        best_scale, best_q = torch.where(fits, scale, best_scale), torch.where(fits, q, best_q)
        missed &= ~fits
    return pack(best_q.reshape(n, k), bits), best_scale[..., 0], low[..., 0], not bool(missed.any())


def check_activations(activations: str, setting: str) -> None:
    if activations not in ACTIVATIONS:
        raise ConfigError(f"{setting}={activations!r}; a quantized layer's activations are "
                          f"{' or '.join(ACTIVATIONS)}.")


# rows (a decoding step's, a draft tree's) the float32 kernel computes; an eager call with more (a prompt) runs
# the dense GEMM over the weights dequantized for the call: about as fast (past a few rows the kernel's cost per
# row is MKL's), and the prompt's sums are then the dense model's own prefill, bit for bit (docs/native.md)
KERNEL_ROWS = 64


class QuantLinear(nn.Module):
    """A linear layer computed from ``bits``-bit codes (`quantize`) on the C++ kernel, its inputs at
    ``activations`` width (`ACTIVATIONS`); its bias (if any) is the original's tensor, added after; more
    than `KERNEL_ROWS` rows at float32 eagerly: the dense GEMM over `dequantized` weights."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor, bits: int,
                 bias: torch.Tensor | None = None, activations: str = "float32"):
        super().__init__()
        check_activations(activations, "activations")
        self.bits, self.bias, self.activations = bits, bias, activations
        load()
        self.op = getattr(torch.ops.spec_zoo, ACTIVATIONS[activations])
        self.in_features, self.out_features = scales.shape[1] * GROUP, codes.shape[0]
        # the float32 kernel's codes in the order it reads them (`kernel_codes`); the int8 one's in GGUF's
        self._weight: torch.Tensor | None = None  # `weight`, once read
        self.register_buffer("codes", kernel_codes(codes, bits) if activations == "float32" else codes)
        self.register_buffer("scales", scales)
        self.register_buffer("lows", lows)

    @classmethod
    def of(cls, linear: nn.Linear, bits: int | str, activations: str = "float32") -> tuple[QuantLinear, bool]:
        """The layer at ``bits`` bits and whether its weights are the same (exact); ``bits="auto"``: 4
        where that holds the weights exactly (a Q4_1 file's layer), else 8."""
        codes, scales, lows, width, exact = _search(linear.weight, bits)
        return cls(codes, scales, lows, width, linear.bias, activations), exact

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] the layer computes with (`dequantize`'s, bit for bit, in C++)."""
        codes, scales, lows = (self.get_buffer(name) for name in ("codes", "scales", "lows"))
        codes = codes if self.activations == "float32" else kernel_codes(codes, self.bits)  # the kernel's order
        return torch.ops.spec_zoo.quant_weight(codes, scales, lows, self.bits)

    @property
    def weight(self) -> torch.Tensor:
        """The float32 weight it computes with (`dequantized`), for code that reads a linear layer's weight
        (a draft head sharing the target's output rows, a target's digest): made at the first read, then kept."""
        if self._weight is None:
            self._weight = self.dequantized()
        return self._weight

    def as_linear(self) -> nn.Linear:
        """The float32 layer it computes (its `dequantized` weight, its bias)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = nn.Parameter(self.dequantized(), requires_grad=False)
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias, requires_grad=False)
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prompt = not torch.compiler.is_compiling() and x.numel() > KERNEL_ROWS * x.shape[-1]  # never traced
        if prompt and self.activations == "float32":
            weight = self._weight if self._weight is not None else self.dequantized()  # kept only once read
            return nn.functional.linear(x, weight, self.bias)  # a prompt: the dense model's own GEMM
        y = self.op(x, self.codes, self.scales, self.lows, self.bits)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"activations={self.activations}")


Module = TypeVar("Module", bound=nn.Module)


def as_dense(module: Module) -> Module:
    """``module`` with each `QuantLinear` in it replaced by the float32 layer it computes (`QuantLinear.as_linear`):
    what a head that starts as a copy of a target's layer trains and stores, whatever the target's width."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, QuantLinear):
                setattr(parent, name, child.as_linear())
    return module


def check_bits(bits, setting: str) -> None:
    if bits not in (*BITS, "auto"):
        raise ConfigError(f"{setting}={bits!r}; quantized weights are 4 or 8 bits wide, or auto (4 where "
                          "that holds a layer exactly, else 8).")


def quantized_model(model: nn.Module, bits: int | str = "auto", head_bits: int | str = "auto",
                    activations: str = "float32") -> tuple[nn.Module, int, int]:
    """(a copy of ``model`` whose linear layers are `QuantLinear`s at ``bits`` bits, its output layer at
    ``head_bits`` (each `QuantLinear.of`), all with ``activations``; the layers quantized, how many of them
    hold exactly the original's weights). A float32 model's other tensors are shared, not copied; a model
    in another dtype is copied to float32 (the kernel's). ``model`` is left as it was."""
    check_bits(bits, "bits")
    check_bits(head_bits, "head_bits")
    check_activations(activations, "activations")
    load()  # built now, once per machine: a missing compiler fails before the work
    if next(model.parameters()).dtype == torch.float32:
        result = copy.deepcopy(model, {id(t): t for t in [*model.parameters(), *model.buffers()]})
    else:
        result = copy.deepcopy(model).float()
    head = getattr(result, "get_output_embeddings", lambda: None)()  # a Hugging Face model's output layer
    places = []  # (parent, name, the float layer, its width)
    for module in list(result.modules()):
        for name, child in list(module.named_children()):
            width = head_bits if child is head else bits
            if isinstance(child, QuantLinear):  # a model at its own width: its layers made again at this one
                child = child.as_linear()
            if isinstance(child, nn.Linear) and child.in_features % GROUP == 0:
                places.append((module, name, child, width))
    layers = [(linear.weight, width) for _, _, linear, width in places]
    big = sum(weight.numel() for weight, _ in layers) >= CACHED_FROM
    found = _found_codes(layers, f"{fingerprint(model)} {bits} {head_bits}" if big else None)
    for (module, name, linear, _), (codes, scales, lows, width, _) in zip(places, found):
        setattr(module, name, QuantLinear(codes, scales, lows, width, linear.bias, activations))
    return result, len(places), sum(exact for *_, exact in found)


Found = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool]  # codes, scales, lows, bits, exact


def _search(weight: torch.Tensor, bits: int | str) -> Found:
    """(codes, scales, lows, bits, exact) of ``weight`` at ``bits`` (`quantize`); ``auto``: 4 where that holds
    the weights exactly, else 8."""
    for width in (4, 8) if bits == "auto" else (int(bits),):
        codes, scales, lows, exact = quantize(weight, width)
        if exact:
            break
    return codes, scales, lows, width, exact


CACHED_FROM = 1 << 24  # weights: a smaller model is searched on every load (well under a second; test models)


def _found_codes(layers: list[tuple[torch.Tensor, int | str]], key: str | None) -> list[Found]:
    """Each (weight, bits)'s `_search` result, read from the cache (``<cache_root>/codes``) where a model of
    these weights (``key``: its `fingerprint` and widths; None: never cached) was searched before: the search
    takes ~5 s of every load of a 100M-weight model, the read ~0.1 s. A damaged entry is searched and written
    again."""
    if key is None:
        return [_search(weight, bits) for weight, bits in layers]
    digest = hashlib.blake2b(f"spec-zoo codes 1 {key}".encode(), digest_size=16)
    path = cache_root() / "codes" / f"{digest.hexdigest()}.safetensors"
    try:
        stored = load_file(path)
        return [(stored[f"{i}.codes"], stored[f"{i}.scales"], stored[f"{i}.lows"], int(stored[f"{i}.bits"]),
                 bool(stored[f"{i}.exact"])) for i in range(len(layers))]
    except (OSError, SafetensorError, KeyError):  # not there yet, or damaged
        pass
    found = [_search(weight, bits) for weight, bits in layers]
    tensors = {}
    for i, (codes, scales, lows, bits, exact) in enumerate(found):
        tensors.update({f"{i}.codes": codes.contiguous(), f"{i}.scales": scales.contiguous(),
                        f"{i}.lows": lows.contiguous(), f"{i}.bits": torch.tensor(bits),
                        f"{i}.exact": torch.tensor(exact)})
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))
    return found


# model.weights: how a target's linear layers are stored and computed (activations float32 in every case):
# dense (float tensors, as loaded), native (the model's own codes: each layer at 4 bits where that holds it
# exactly, else 8; refused where neither does), int4 / int8 (quantized on load: a different model)
WEIGHTS: dict[str, tuple[int | str, int | str] | None] = {
    "dense": None, "native": ("auto", "auto"), "int4": (4, 4), "int8": (8, 8)}


def check_weights(weights, dtype: str, key: str = "model") -> None:
    """A width `at_width` takes, with a dtype its kernel computes in, or a clear error."""
    if weights not in WEIGHTS:
        raise ConfigError(f"{key}.weights={weights!r}; use one of: {', '.join(WEIGHTS)} (docs/native.md).")
    if weights != "dense" and dtype != "float32":
        raise ConfigError(f"{key}.weights={weights} computes in float32 (codes dequantized in registers, float32 "
                          f"sums); set {key}.dtype=float32, or {key}.weights=dense.")


def at_width(model: nn.Module, weights: str, key: str = "model") -> nn.Module:
    """``model`` with its linear layers at ``weights`` width (`WEIGHTS`): every one a `QuantLinear`
    with float32 activations, its other tensors shared. ``native`` refuses a model any of whose layers
    no width holds exactly: it would be another model."""
    check_weights(weights, str(next(model.parameters()).dtype).removeprefix("torch."), key)
    widths = WEIGHTS[weights]
    if widths is None:
        return model
    result, layers, exact = quantized_model(model, *widths, activations="float32")
    if weights == "native" and exact < layers:
        raise ConfigError(f"{key}.weights=native keeps a model's own 4- or 8-bit codes, but {layers - exact} of its "
                          f"{layers} linear layers are not stored that way (a float model, or a GGUF format other "
                          f"than Q4_1 / Q8_0); set {key}.weights=int8 or int4 (quantized on load: a different "
                          f"model) or {key}.weights=dense.")
    return result
