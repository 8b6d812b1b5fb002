"""Distillation losses between the target's next-token distribution p and the draft's q.

The target's distribution is stored top-k truncated (``k`` ids + their log-probabilities
under the full softmax); the mass outside them, r = 1 - sum(top-k p), is one "rest"
bucket. The draft's q lives on its draft vocabulary (zero elsewhere). Every loss is
computed exactly on this coarsened distribution: (top-k tokens, rest). With k = V (no
truncation) that is the exact full-distribution loss; with k < V it is a lower bound of
the full one (merging outcomes never increases a divergence).

* ``fkl``: forward KL(p || q), mass-covering (the classic distillation loss).
* ``rkl``: reverse KL(q || p), mode-seeking.
* ``tvd``: total variation 0.5 * sum |p - q|. The acceptance probability of one draft
  token under exact rejection sampling is 1 - TV(p, q) (Leviathan et al.), which is why
  DistillSpec recommends it.
"""

from __future__ import annotations

import torch

from spec_zoo.errors import ConfigError

LOSSES = ("fkl", "rkl", "tvd")
LABELS = ("tokens", "distributions")  # what a head trains on: the written token, or `divergence` on the top-k
_EPS = 1e-8


def check_labels(key: str, value) -> None:
    """Refuse a ``labels`` setting (config key ``key``) that is not one of `LABELS`."""
    if value not in LABELS:
        raise ConfigError(f"{key}={value!r}; allowed values: {', '.join(LABELS)}.")


def label_loss(labels: str, logits: torch.Tensor, written: torch.Tensor, t_index: torch.Tensor,
               t_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-position loss [N] of a head guessing a position ahead (Medusa, Hydra, MLP speculator):
    ``tokens``: cross-entropy on the token the target wrote there (``written`` [N], positions in
    the draft vocabulary), i.e. fkl against a one-hot teacher; ``distributions``: ``kind``
    against the target's top-k distribution there (``t_index``, ``t_logp`` as for `divergence`)."""
    if labels == "tokens":
        return divergence(logits, written[:, None], torch.zeros(len(written), 1, device=logits.device), "fkl")
    return divergence(logits, t_index, t_logp, kind)


def divergence(student_logits: torch.Tensor, t_index: torch.Tensor, t_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-position loss [N].

    student_logits: [N, K] logits over the draft vocabulary.
    t_index:        [N, k] the teacher's top-k token positions in the draft vocabulary,
                    -1 where the token is not in it (q = 0 there).
    t_logp:         [N, k] the teacher's log-probabilities of those tokens (-inf = padding).
    """
    q_log = student_logits.float().log_softmax(-1)
    kept = t_index >= 0
    idx = t_index.clamp(min=0)
    p = t_logp.float().exp()
    r = (1.0 - p.sum(-1)).clamp(min=0.0)
    qk_log = q_log.gather(-1, idx)
    qk = qk_log.exp() * kept
    q_rest = (1.0 - qk.sum(-1)).clamp(min=0.0)
    if kind == "tvd":
        return 0.5 * (((p - qk).abs() * kept).sum(-1) + (p * ~kept).sum(-1) + (r - q_rest).abs())
    if kind == "fkl":
        # tokens the draft cannot emit add a constant (infinite) term: left out
        inside = torch.where(kept & (p > 0), p * (t_logp.float().clamp(min=-1e4) - qk_log), torch.zeros_like(p)).sum(-1)
        return inside + torch.xlogy(r, r) - r * torch.log(q_rest + _EPS)
    if kind == "rkl":
        inside = torch.where(kept, qk * (qk_log - t_logp.float().clamp(min=-1e4)), torch.zeros_like(p)).sum(-1)
        # q_rest * log(q_rest + eps), not xlogy: its gradient at 0 is -inf (NaN after the clamp)
        return inside + q_rest * (torch.log(q_rest + _EPS) - torch.log(r + _EPS))
    raise ValueError(f"unknown loss {kind!r}; use one of {LOSSES}")


@torch.no_grad()
def agreement(student_logits: torch.Tensor, vocab_ids: torch.Tensor | None, t_ids: torch.Tensor,
              t_index: torch.Tensor, t_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(greedy match [N] bool, sampled acceptance 1 - TV [N]) of draft vs target.

    greedy match: the draft's argmax is the target's argmax, i.e. a greedy draft token
    is accepted by greedy verification. 1 - TV is the acceptance probability of a
    sampled draft token at temperature 1 (a lower bound of it when top-k truncated... an
    upper bound: the TV here is a lower bound of the full one)."""
    top = student_logits.argmax(-1)
    top_ids = top if vocab_ids is None else vocab_ids.to(top.device)[top]
    greedy = top_ids == t_ids[:, 0]
    return greedy, 1.0 - divergence(student_logits, t_index, t_logp, "tvd")
