"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh: "Block
Verification Accelerates Speculative Decoding", ICLR 2025, Algorithm 2), for chains.

WHY: token-wise rejection accepts X_i with min(1, p/q) on its own and stops at the first
rejection, wasting mass that a later token could have used. Block verification judges the
block jointly: it keeps a running weight (p_0 = 1)

    p_i = min(1, p_{i-1} * p(X_i | X^{i-1}) / q(X_i | X^{i-1})),

the probability, given the draft prefix X^i, that at least X^i is kept, and decides the
accepted length tau from the longest prefix down: keep all gamma tokens with probability
h_gamma = p_gamma, otherwise keep i < gamma tokens with probability

    h_i = r_i / (r_i + 1 - p_i),   r_i = sum_x max(p_i * p(x | X^i) - q(x | X^i), 0),

(0 when r_i + 1 - p_i = 0: then p_i = 1 and p = q, there is nothing to recover), and
length 0 when every longer prefix was turned down. The recovered token after X^tau is
drawn from the *block residual* norm(max(p_tau * p(. | X^tau) - q(. | X^tau), 0)) (at
tau = 0 the token-wise residual, as p_0 = 1); when tau = gamma the bonus token comes
from p(. | X^gamma).

Why it is exact: h_i is chosen so that P(tau >= i | X^i) = p_i (induction from the end:
the longer prefixes are kept with sum_x min(p_i p(x), q(x)) = p_i - r_i, and h_i fills
the gap to p_i). Hence P(X^i = x^i, tau >= i) = q(x^i) p_i, and the token at position
i + 1 is either the draft's (mass q(x^i) min(p_i p(x), q(x))) or recovered after
stopping at i (mass q(x^i) r_i * residual(x) = q(x^i) max(p_i p(x) - q(x), 0)); the two
add up to q(x^i) p_i p(x): given what was kept so far, the next token follows p exactly.
The rule is never worse than token-wise rejection (the paper proves it optimal) and at
temperature 0 (p one-hot) every p_i and h_i is 0 or 1: it is greedy matching.

Trees are refused (the paper's rule is for one block); use verifier=rejection for them.
"""

from __future__ import annotations

import torch

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Verdict, Verifier
from spec_zoo.sampling import accept, logits_to_probs, sample

TREE_ERROR = ("verifier=block verifies chains only, but {what} proposes trees; use verifier=rejection "
              "(recursive rejection handles trees) or a chain drafter (e.g. drafter=small_model).")


class BlockVerifier(Verifier):
    """Lossless at any temperature, chains only; accepts at least as much as rejection."""

    name = "block"
    lossless = True

    def check_drafter(self, drafter) -> None:
        """Refuse, before decoding, a drafter that proposes trees."""
        if drafter.drafts_trees:
            raise ConfigError(TREE_ERROR.format(what=f"drafter={drafter.name}"))
        super().check_drafter(drafter)

    def verify(self, draft: Draft, target_logits: torch.Tensor, sampling, generator) -> Verdict:
        if not draft.is_chain:
            raise ConfigError(TREE_ERROR.format(what="the drafter"))
        p = logits_to_probs(target_logits, sampling)  # row i: p(. | X^i)
        n = len(draft)
        q = draft_probs(draft, p)
        h, residual = block_weights(p, q, draft.tokens)
        tau = 0
        for i in range(n, 0, -1):  # the longest prefix first; the first kept one wins
            if accept(h[i], 1.0, generator):  # with probability h_i
                tau = i
                break
        if tau == n:
            return Verdict(list(range(n)), int(sample(p[n], generator)), bonus=True)
        mass = residual[tau].sum()
        # mass is 0 only through rounding (where stopping at tau has probability ~0)
        recovered = residual[tau] / mass if mass > 0 else p[tau]
        return Verdict(list(range(tau)), int(sample(recovered, generator)), bonus=False)


def draft_probs(draft: Draft, like: torch.Tensor) -> torch.Tensor:
    """q as [n, V] rows (row i: the distribution node i was drawn from); one-hot rows for a
    deterministic drafter (``probs is None``)."""
    if draft.probs is not None:
        return draft.probs.to(like)
    return torch.nn.functional.one_hot(draft.tokens.to(like.device), like.shape[-1]).to(like)


def block_weights(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule in closed form for one block of n tokens: p [n + 1, V], q [n, V].

    Returns h [n + 1] (h[i]: the probability of keeping exactly i tokens once every longer
    prefix was turned down; h[0] = 1, h[n] = p_n) and the unnormalised block residuals
    [n, V] (row i: max(p_i * p(. | X^i) - q(. | X^i), 0))."""
    n = len(tokens)
    weights = [1.0]  # p_0 .. p_n
    for i, x in enumerate(tokens.tolist()):
        kept, drafted = weights[-1] * float(p[i, x]), float(q[i, x])
        weights.append(1.0 if kept >= drafted else kept / drafted)  # min(1, kept / drafted), no 0/0
    w = torch.tensor(weights, dtype=p.dtype, device=p.device)
    residual = (w[:n, None] * p[:n] - q).clamp(min=0)
    r = residual.sum(-1)
    denom = r + 1 - w[:n]
    h = torch.cat([torch.where(denom > 0, r / denom, 0.0), w[n:]])
    h[0] = 1.0
    return h, residual
