"""Greedy match: accept a node while it equals the target's argmax (lossless at temperature 0)."""

from __future__ import annotations

import torch

from spec_zoo.draft import ROOT, SIBLING_MODES, Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Verdict, Verifier
from spec_zoo.sampling import SamplingParams


class GreedyVerifier(Verifier):
    """Walks the draft from the root, following the child that equals the target's
    argmax; the first position without such a child yields the recovered token (the
    argmax), a leaf yields the bonus token. Output equals plain greedy decoding."""

    name = "greedy"
    lossless = True
    sibling_modes = SIBLING_MODES  # follows the argmax whatever q was

    def check(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise ConfigError(
                f"verifier=greedy only works at generation.temperature=0 (got {sampling.temperature}); "
                "use verifier=rejection for exact sampling at temperature > 0."
            )

    def verify(self, draft: Draft, target_logits: torch.Tensor, sampling, generator) -> Verdict:
        best = target_logits.argmax(-1).tolist()
        tokens = draft.tokens.tolist()
        path: list[int] = []
        node = ROOT
        while True:
            want = best[node + 1]  # row 0 is the root, row i + 1 follows node i
            kids = draft.children(node)
            match = next((c for c in kids if tokens[c] == want), None)
            if match is None:
                return Verdict(path, want, bonus=not kids)
            path.append(match)
            node = match
