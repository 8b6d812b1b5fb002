"""Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023), extended to
trees by multi-draft recursive rejection (SpecInfer, Miao et al. 2024).

At a node, try its children in order: accept child x with probability
min(1, p(x) / q(x)); on rejection replace p by norm(max(0, p - q)) and try the next
sibling. If every child is rejected, draw the recovered token from what is left of p.
Siblings must be drawn independently from q (with replacement), or be deterministic
(``probs is None``: q is one-hot, so a rejected token simply loses its mass). Either
way the committed token follows p exactly: the rule is lossless.
"""

from __future__ import annotations

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.interfaces import Verdict, Verifier
from spec_zoo.sampling import logits_to_probs, sample


class RejectionVerifier(Verifier):
    """Lossless at any temperature (at temperature 0 it reduces to greedy match)."""

    name = "rejection"
    lossless = True

    def verify(self, draft: Draft, target_logits: torch.Tensor, sampling, generator) -> Verdict:
        p_rows = logits_to_probs(target_logits, sampling)
        tokens = draft.tokens.tolist()
        path, node = [], ROOT
        while True:
            p = p_rows[node + 1]
            kids = draft.children(node)
            accepted = None
            for child in kids:
                x = tokens[child]
                q = _one_hot(x, p) if draft.probs is None else draft.probs[child].to(p)
                u = torch.rand((), generator=generator, device=generator.device)
                if u * q[x] < p[x]:  # u < p/q without dividing by a zero q
                    accepted = child
                    break
                residual = (p - q).clamp_(min=0)
                total = residual.sum()
                if total > 0:  # zero only through rounding when p == q, where nothing is rejected
                    p = residual / total
            if accepted is None:
                return Verdict(path, int(sample(p, generator)), bonus=not kids)
            path.append(accepted)
            node = accepted


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
