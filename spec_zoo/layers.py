"""Run a span of a Llama-family model's decoder layers by hand.

Self-speculation needs two things ``model(...)`` cannot do: stop after layer E (the
draft's early exit) and later resume from layer E with hidden states computed earlier
(KV reuse: verification skips the layers the draft already ran). Both come down to
calling the model's own decoder layers in a loop with the model's own rotary
embeddings, so the numbers are the target's (no weight copy, no reimplementation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_zoo.errors import ConfigError


@dataclass
class LayerStates:
    """Hidden states entering decoder layer ``layer`` ([positions, H]), for positions whose
    KV in layers < ``layer`` is already in the target's cache: the target resumes from here."""

    layer: int
    hidden: torch.Tensor


class DecoderStack:
    """The pieces of a Llama-family causal LM (``model.model.{embed_tokens, layers, norm,
    rotary_emb}`` and ``model.lm_head``: Llama, Mistral, Qwen2, SmolLM, ...)."""

    def __init__(self, model):
        inner = getattr(model, "model", None)
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
            raise ConfigError(
                f"{type(model).__name__} does not expose model.layers / norm / rotary_emb / lm_head; "
                "layer-level drafting (early exit) supports Llama-family models (Llama, Mistral, Qwen2, SmolLM)."
            )
        self.model, self.inner = model, inner
        self.num_layers = len(inner.layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_tokens(ids)

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        """(cos, sin) for ``positions`` ([1, q]), shared by every layer of a pass."""
        return self.inner.rotary_emb(hidden, position_ids=positions)

    def run(self, hidden, start: int, end: int, positions, cache, mask=None, rotary=None, **attention) -> torch.Tensor:
        """Hidden states [1, q, H] after layers ``start .. end - 1``; their KV is appended to
        ``cache`` (the layers' own indices). ``attention`` goes to the attention function."""
        rotary = self.rotary(hidden, positions) if rotary is None else rotary
        for layer in self.inner.layers[start:end]:
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, cache=cache,
                           use_cache=cache is not None, position_embeddings=rotary, **attention)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's own final norm and LM head."""
        return self.model.lm_head(self.inner.norm(hidden))


def causal_mask(past: int, q: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive [1, 1, q, past + q] mask for q new positions after ``past`` cached ones
    (None for a single position, which may attend to everything)."""
    if q == 1:
        return None
    allowed = torch.ones(q, past + q, dtype=torch.bool).tril(diagonal=past)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
