"""Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023), extended to
trees by multi-draft recursive rejection (SpecInfer, Miao et al. 2024; SpecTr, Sun et
al. 2023; Sequoia, Chen et al. 2024).

At a node, try its children in the order they were drawn: accept child x with
probability min(1, p(x) / q_k(x)), where q_k is the distribution the k-th sibling was
drawn from given the earlier ones; on rejection replace p by norm(max(0, p - q_k)) and
try the next. If every child is rejected, draw the recovered token from what is left of
p. q_k depends on how the draft says its siblings were drawn (``Draft.siblings``):

- "iid": q_k = q, the node's row (SpecInfer). A token drawn twice but scored once is
  replayed as often as it was drawn (``Draft.draws``): the repeat is surely rejected, but
  its residual update still counts.
- "without_replacement": q_k = q with the k - 1 earlier siblings' tokens removed,
  renormalised (SpecTr/Sequoia).
- "deterministic": q_k is one-hot at the sibling's token, so a rejected token just loses
  its mass.

Each step outputs y with probability min(p, q_k)(y) + max(0, p - q_k)(y) = p(y), for any
q_k the sibling was really drawn from, so by induction over the siblings (and the
levels) the committed tokens follow p exactly: the rule is lossless (docs/trees.md).
"""

from __future__ import annotations

import torch

from spec_zoo.draft import ROOT, SIBLING_MODES, Draft
from spec_zoo.interfaces import Verdict, Verifier
from spec_zoo.sampling import accept, logits_to_probs, sample


class RejectionVerifier(Verifier):
    """Lossless at any temperature (at temperature 0 it reduces to greedy match)."""

    name = "rejection"
    lossless = True
    sibling_modes = SIBLING_MODES

    def verify(self, draft: Draft, target_logits: torch.Tensor, sampling, generator) -> Verdict:
        p_rows = logits_to_probs(target_logits, sampling)
        tokens = draft.tokens.tolist()
        path: list[int] = []
        node = ROOT
        while True:
            p = p_rows[node + 1]
            draws = draft.draws_of(node)
            accepted: int | None = None
            tried: list[int] = []
            for child in draws:
                x = tokens[child]
                q = proposal(draft, child, tried, p)
                if accept(p[x], q[x], generator):  # with probability min(1, p(x) / q_k(x))
                    accepted = child
                    break
                tried.append(x)
                residual = (p - q).clamp_(min=0)
                total = residual.sum()
                if total > 0:  # zero only through rounding when p == q, where nothing is rejected
                    p = residual / total
            if accepted is None:
                return Verdict(path, int(sample(p, generator)), bonus=not draws)
            path.append(accepted)
            node = accepted


def proposal(draft: Draft, child: int, tried: list[int], like: torch.Tensor) -> torch.Tensor:
    """q_k: the distribution ``child`` was drawn from, after its siblings' tokens ``tried``."""
    if draft.siblings == "deterministic":
        q = torch.zeros_like(like)
        q[int(draft.tokens[child])] = 1.0
        return q
    assert draft.probs is not None  # a Draft with sampled siblings carries their rows
    q = draft.probs[child].to(like)
    if draft.siblings == "without_replacement" and tried:
        q = q.clone()
        q[tried] = 0.0
        q /= q.sum()
    return q
