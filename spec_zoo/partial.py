"""`PartialForward`: a target's first layers run ahead of its committed tokens (the shallow
pass of a self-speculative draft, ``drafters/early_exit/``), kept so that the target's next
score of exactly those tokens resumes at that layer instead of running them again (KV
reuse). A component `spec_zoo.runtime.target.Target` delegates to (``Target.partial``); it runs
layers only through the `DecoderStack` and writes only the cache it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_zoo.draft import Draft
from spec_zoo.runtime.layers import DecoderStack, final_logits


@dataclass
class LayerStates:
    """Hidden states entering decoder layer ``layer`` ([positions, H]), for positions whose
    KV in layers < ``layer`` is already in the target's cache: the target resumes from here."""

    layer: int
    hidden: torch.Tensor


class PartialForward:
    """The tokens run through layers 0..E-1 after the cached ones (``tokens``: their KV only
    in layers < E) and the states entering layer E (``states``)."""

    def __init__(self) -> None:
        self.states: LayerStates | None = None
        self.tokens: list[int] = []

    def clear(self) -> None:
        """Forget the partial tokens (the caller crops their shallow KV)."""
        self.states, self.tokens = None, []

    def run(self, stack: DecoderStack, cache, tokens: list[int], end: int, past: int,
            mask: torch.Tensor | None) -> torch.Tensor:
        """Run ``tokens`` through layers 0..end-1 after ``past`` positions (the cached and the
        earlier partial tokens), writing their KV into ``cache``; return their states entering
        layer ``end`` ([len(tokens), H]). ``mask``: the target's partial-forward mask."""
        if self.states is not None and self.states.layer != end:
            raise RuntimeError(f"forward_layers(end={end}) after a partial forward to layer {self.states.layer}")
        device = stack.model.device
        hidden = stack.embed(torch.tensor([tokens], device=device))
        positions = torch.arange(past, past + len(tokens), device=device)[None]
        hidden = stack.run(hidden, 0, end, positions, cache, mask)[0]
        rows = hidden if self.states is None else torch.cat([self.states.hidden, hidden])
        self.states, self.tokens = LayerStates(end, rows), self.tokens + list(tokens)
        return hidden

    def resumable(self, cached: list[int], committed: list[int], draft: Draft) -> int:
        """How many partial tokens a score of ``committed`` + ``draft`` would read: the new
        committed tokens then the nodes of a chain, when they are exactly the first partial
        ones (0: they are not; the score starts at layer 0)."""
        if self.states is None or not draft.is_chain:
            return 0
        expected = committed[len(cached):] + draft.tokens.tolist()
        if committed[: len(cached)] == cached and self.tokens[: len(expected)] == expected:
            return len(expected)
        return 0

    def resume(self, stack: DecoderStack, cache, past: int, q: int, n: int,
               mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Finish the first ``q`` partial tokens (the last ``n`` of them draft nodes) from the
        partial layer on, after ``past`` cached positions (``cache`` already cropped to
        ``past + q``): (logits [n + 1, V] after the last committed token and each node, the
        final-norm states [q, H]). The partial forward is then spent."""
        assert self.states is not None
        layer, states = self.states.layer, self.states.hidden[:q]
        self.clear()
        positions = torch.arange(past, past + q, device=states.device)[None]
        out = stack.run(states[None], layer, stack.num_layers, positions, cache, mask)
        normed = stack.inner.norm(out[0])
        return final_logits(stack.model, normed[q - n - 1 :]), normed  # the model's own post-processing too
