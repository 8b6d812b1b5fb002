"""Run a span of a decoder-only model's layers by hand, and its logits from final states.

Self-speculation needs two things ``model(...)`` cannot do: stop after layer E (the
draft's early exit) and later resume from layer E with hidden states computed earlier
(KV reuse: verification skips the layers the draft already ran). Both come down to
calling the model's own decoder layers in a loop with the model's own rotary embeddings
(one per layer type where the model has several, as Gemma 3) and the model's own masks
(transformers' mask functions, full or sliding-window per layer), so the numbers are the
target's (no weight copy, no reimplementation).

`final_logits` is the one place spec-zoo turns final states into the target's logits: the
model's LM head and then the model's own post-processing (Gemma's ``final_logit_softcapping``,
a ``logit_scale`` or ``logits_scaling``), so a resumed or compiled forward never verifies
against a distribution the model's forward would not produce. `DecoderStack` checks this on
the model itself before any work (`DecoderStack.check`), so a family whose forward does
something this path does not is refused instead of served wrong.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicCache, get_layer_types_and_kwargs
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from spec_zoo.errors import ConfigError

MASKS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}


def layer_types(config) -> list[str]:
    """Each decoder layer's attention type (``full_attention``, ``sliding_attention``), as
    transformers reads it from the config (``layer_types``, else ``sliding_window``)."""
    return get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0]


def final_logits(model, normed: torch.Tensor) -> torch.Tensor:
    """The model's logits from its final (normed) hidden states: its LM head, then what its
    forward does to logits after the head (soft-capping, scaling)."""
    logits = model.get_output_embeddings()(normed)
    config = model.config.get_text_config(decoder=True)
    if (scale := getattr(config, "logit_scale", None)) is not None:  # Cohere multiplies
        logits = logits * scale
    if (scale := getattr(config, "logits_scaling", None)) is not None:  # Granite divides
        logits = logits / scale
    if (cap := getattr(config, "final_logit_softcapping", None)) is not None:  # Gemma 2/3
        logits = torch.tanh(logits / cap) * cap
    return logits


class DecoderStack:
    """The pieces of a decoder-only causal LM laid out as ``model.model.{embed_tokens, layers,
    norm, rotary_emb}`` and ``model.lm_head`` (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3,
    OLMo 2, Qwen2-MoE, SmolLM, ...)."""

    def __init__(self, model):
        inner = getattr(model, "model", None)
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
            raise ConfigError(
                f"{type(model).__name__} does not expose model.layers / norm / rotary_emb / lm_head; layer-level "
                "work (drafter=early_exit, eagle, model.runtime=compiled) supports Llama-family layouts (Llama, "
                "Mistral, Qwen2/3, Gemma 2/3, Phi-3, OLMo 2, Qwen2-MoE): use another drafter or model.runtime=eager."
            )
        self.model, self.inner = model, inner
        self.num_layers = len(inner.layers)
        self.layer_types = layer_types(model.config)
        self._typed_rotary = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_tokens(ids)

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor, layer_type: str = "full_attention"):
        """(cos, sin) for ``positions`` ([1, q]) in layers of ``layer_type`` (one rotary for all
        types unless the model has one per type, as Gemma 3)."""
        if self._typed_rotary:
            return self.inner.rotary_emb(hidden, positions, layer_type)
        return self.inner.rotary_emb(hidden, position_ids=positions)

    def masks(self, hidden, positions, cache, start: int, end: int) -> dict:
        """The model's own mask of each layer type in ``start .. end - 1``, sized against the
        first such layer's cache (a partial forward leaves layers at different lengths)."""
        masks = {}
        for index in range(start, end):
            kind = self.layer_types[index]
            if kind not in masks:
                masks[kind] = MASKS[kind](config=self.model.config, inputs_embeds=hidden, attention_mask=None,
                                          cache=cache, position_ids=positions, layer_idx=index)
        return masks

    def run(self, hidden, start: int, end: int, positions, cache, mask=None, rotary=None, **attention) -> torch.Tensor:
        """Hidden states [1, q, H] after layers ``start .. end - 1``; their KV is appended to
        ``cache`` (the layers' own indices). ``mask`` None: the model's own masks per layer
        type; a tensor serves every layer. ``attention`` goes to the attention function."""
        masks = self.masks(hidden, positions, cache, start, end) if mask is None else None
        rotaries = {}
        for index in range(start, end):
            kind = self.layer_types[index]
            if kind not in rotaries:
                rotaries[kind] = self.rotary(hidden, positions, kind) if rotary is None else rotary
            hidden = self.inner.layers[index](
                hidden, attention_mask=mask if masks is None else masks[kind], position_ids=positions, cache=cache,
                use_cache=cache is not None, position_embeddings=rotaries[kind], **attention)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's own final norm, LM head and logit post-processing."""
        return final_logits(self.model, self.inner.norm(hidden))

    @torch.no_grad()
    def check(self) -> None:
        """Refuse (ConfigError) a model whose own forward this layer-by-layer path does not
        reproduce (an embedding scale, a logit transform or a block shape it does not know)."""
        ids = torch.arange(2, 7, device=self.model.device)[None] % self.model.config.get_text_config().vocab_size
        positions = torch.arange(ids.shape[1], device=self.model.device)[None]
        theirs = self.model(input_ids=ids, use_cache=False).logits[0].double()
        hidden = self.run(self.embed(ids), 0, self.num_layers, positions, DynamicCache())
        mine = self.logits(hidden[0]).double()
        tolerance = 1e-6 if self.model.dtype == torch.float64 else 1e-2 * max(1.0, float(theirs.abs().max()))
        if not torch.allclose(mine, theirs, atol=tolerance, rtol=0):
            raise ConfigError(
                f"{type(self.model).__name__}: spec-zoo's layer-by-layer forward differs from the model's own "
                f"(max |diff| {float((mine - theirs).abs().max()):.3g}); layer-level work (drafter=early_exit, eagle, "
                "model.runtime=compiled) does not support this family: use another drafter or model.runtime=eager.")


def causal_mask(past: int, q: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive [1, 1, q, past + q] mask for q new positions after ``past`` cached ones
    (None for a single position, which may attend to everything)."""
    if q == 1:
        return None
    allowed = torch.ones(q, past + q, dtype=torch.bool).tril(diagonal=past)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
