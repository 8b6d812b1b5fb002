"""Early exit's draft as one compiled graph: the target's layers 0..E-1 and the exit head.

Eagerly, the draft's E layers (and the deep-layer resume of KV reuse) ran beside the compiled
target at several times their share of the weights: `early_exit_adapter_compiled` was 0.44x
`ar_compiled` on Spec-Bench, its verify step 168 ms against 90 ms for plain decoding. Here the
draft (layers 0..E-1, then the exit adapter's layer or the target's final norm, and the exit
head) is one graph on its own static cache, run by `spec_zoo.runtime.compiled_head.CompiledHead`'s
machinery (dynamic rows, the row-wise attention, tree paths), and the compiled target verifies
with all its layers. KV reuse is dropped on purpose: the compiled target scores a few rows at
about the price of one, so running the shallow layers again costs less than an eager resume,
and the target's output never depends on what the draft computed. The draft's own rows are
batch invariant, so a seeded sampled run repeats itself.
"""

from __future__ import annotations

import copy

import torch

from spec_zoo.errors import ConfigError
from spec_zoo.runtime import PackedWrites, SlotCache, slot_mask
from spec_zoo.runtime.compiled_head import CompiledHead
from spec_zoo.runtime.layers import DecoderStack


class ExitDraft(torch.nn.Module):
    """Token embeddings -> the target's layers 0..E-1 -> (the adapter's layer) -> exit logits.

    The target's layers are shared, not copied; the adapter (`ExitAdapter`) is copied so its
    layer can own cache slot E of the draft's cache (its original keeps its own one-layer cache).
    """

    def __init__(self, target_model, exit_layer: int, adapter=None):
        super().__init__()
        self.stack, self.exit_layer = DecoderStack(target_model), exit_layer
        self.layers = torch.nn.ModuleList(self.stack.inner.layers[:exit_layer])  # what the graph reads
        self.adapter = None
        if adapter is not None:
            self.adapter = copy.deepcopy(adapter)
            self.adapter.block.self_attn.layer_idx = exit_layer
        else:  # the untrained exit reads the target's final norm and LM head
            self.norm, self.lm_head = self.stack.inner.norm, target_model.get_output_embeddings()

    @property
    def cache_layers(self) -> int:
        return self.exit_layer + (self.adapter is not None)

    def forward(self, hidden, positions, cache, mask, **attention) -> torch.Tensor:
        """The exit head's input states [q, H] of token embeddings ``hidden`` [1, q, H]."""
        hidden = self.stack.run(hidden, 0, self.exit_layer, positions, cache, mask, **attention)
        if self.adapter is not None:
            hidden = self.adapter(hidden, self.stack.rotary(hidden, positions), cache, mask, **attention)
        return hidden[0]

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Over the adapter's draft vocabulary, or the target's whole one (its own head)."""
        return self.adapter.logits(states) if self.adapter is not None else self.stack.logits(states)


class CompiledExit(CompiledHead):
    """`ExitDraft` on a static cache of E (+1) layers, one compiled graph (module doc)."""

    def __init__(self, draft: ExitDraft, **kwargs):
        width = draft.stack.inner.embed_tokens.embedding_dim
        weights = (draft.stack.inner.rotary_emb,)
        super().__init__(draft, draft.stack.rotary, (width, width), weights, cache_layers=draft.cache_layers,
                         **kwargs)

    def _forward(self, embeds, features, positions, mask, slots, draft_mask, pick, row_cache, write_at):
        states = self.head(embeds, positions, PackedWrites(self._store()), mask, draft_slots=slots,
                           draft_mask=draft_mask, row_cache=row_cache, write_at=write_at)
        return states, self.head.logits(states[pick])

    @torch.no_grad()
    def prefill(self, cache: SlotCache, embeds: torch.Tensor) -> None:
        """Feed a run of tokens (a prompt) to the sequence ``cache`` eagerly, in one forward with the
        model's own attention: a long prompt in the graph's chunks of rows would cost seconds more.
        Only the draft reads this KV, so it changes no output; it is the same every run."""
        past, q = cache.length, embeds.shape[1]
        if past + q > self.max_cache_len:
            raise ConfigError(f"the early-exit draft's static cache holds {self.max_cache_len} positions and the "
                              f"sequence needs {past + q}: raise model.max_cache_len, or set {self.key}.runtime=eager.")
        positions = torch.arange(past, past + q, device=embeds.device)[None]
        self.head(embeds, positions, cache, slot_mask(past, q, past + q, self.dtype, embeds.device))
