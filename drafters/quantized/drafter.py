"""The target as its own draft, its linear layers at 4 or 8 bits.

The embedded targets are 4-bit models run as their float32 dequantization, so a copy that
computes from the codes is the same model at a seventh of the bytes a step reads: it agrees
with the target about as often as its arithmetic does (float32 activations, another
summation order), with no training. Where the target came from a GGUF the copy holds the
file's own codes and scales (`spec_zoo.runtime.quant_gemm.quantize` recovers them exactly); any other
target is quantized as llama.cpp would (Q4_1, Q8_0), a draft that agrees less. Everything but
the linear layers (embeddings, norms) is the target's own tensor, shared.

The copy is a draft model like `small_model`'s: its own KV cache, compiled by default, chains
with the adaptive length, trees, greedy or sampled drafts (the draft's distribution is the
copy's, which exact verification handles).
"""

from __future__ import annotations

import torch

from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.models import check_runtime, on_runtime
from spec_zoo.runtime.quant_gemm import check_activations, check_bits, quantized_model
from spec_zoo.runtime.target import Target


class QuantizedDrafter(SmallModelDrafter):
    """Chain or tree drafting by the target's own layers at ``bits`` bits (the output layer at
    ``head_bits``; ``auto``: 4 where that holds a layer exactly, else 8), made when it attaches to the
    target (float32, whatever the target's dtype).

    activations: ``int8`` (default: each group of 32 inputs rounded to int8 and summed as integers,
                 llama.cpp's arithmetic, the fast one) or ``float32`` (the dequantized weights'
                 float32 sums: the target's own model, agreeing more, at about twice the cost).

    runtime: the copy's runtime, ``compiled`` (default: its own static cache and graph, compiled
             once per machine) or ``eager``. Every other argument is `SmallModelDrafter`'s.
    """

    name = "quantized"

    def __init__(self, bits: int | str = "auto", head_bits: int | str = "auto", activations: str = "int8",
                 num_draft: int = 6, adaptive: bool = True, max_draft: int = 16, sample: str | bool = "auto",
                 tree: str | dict | None = None, tree_width: int = 1, tree_depth: int = 0, token_cost: float = 0.25,
                 learn_cost: bool = True, runtime: str = "compiled"):
        check_bits(bits, "drafter.bits")
        check_bits(head_bits, "drafter.head_bits")
        check_activations(activations, "drafter.activations")
        self.bits, self.head_bits, self.activations = bits, head_bits, activations
        self.layers = self.exact = 0
        self._made_for = None
        super().__init__(None, num_draft, adaptive, max_draft, sample, tree, tree_width, tree_depth, token_cost,
                         learn_cost, runtime=runtime)

    def draft_model(self, path, dtype: str, device: str, draft_layers: int, runtime: str) -> tuple[Target, str]:
        check_runtime(runtime, "float32", device, "drafter")
        self.runtime = runtime
        return None, f"the target at {self.bits} bits"  # type: ignore[return-value]  # made in attach

    def attach(self, target: Target) -> None:
        if self._made_for is not target.model:
            model, self.layers, self.exact = quantized_model(target.model, self.bits, self.head_bits, self.activations)
            compiled = {"max_cache_len": target.max_cache_len} if self.runtime == "compiled" and hasattr(
                target, "max_cache_len") else {}
            self.runner, self._made_for = on_runtime(self.runtime, model, target.tokenizer, **compiled), target.model
        self.logits_dtype = target.dtype
        super().attach(target)

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The copy's float32 logits in the target's dtype: a sampled draft's q is then computed as the
        verifier computes with it (float32 probabilities read in float64 sum to 1 only within ~1e-8)."""
        return logits.to(self.logits_dtype)
