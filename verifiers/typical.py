"""Typical acceptance (Medusa, Cai et al. 2024): LOSSY. Accept draft tokens the target finds
plausible enough instead of only those it would have produced.

A node x is accepted when its parent is and p(x) > min(epsilon, delta * exp(-H(p))), with p
the target's distribution at the parent's context under the run's sampling parameters (its
temperature, top-k, top-p) and H(p) its entropy: a confident target (low entropy) demands
a token near its own choice, an uncertain one accepts any token with mass above
``epsilon``. Over a tree the longest accepted path wins (ties: the one the target finds
most likely). The token added after the path is the target's argmax ("greedy on the first
token", as Medusa does), so every step still commits at least one token of the target's
own choosing.

At temperature 0, p is one-hot and the rule is greedy matching: the output is plain greedy
decoding. Above 0 the committed text does not follow the target's sampling distribution
(it is closer to greedy decoding, with plausible detours): faster, but not exact.
"""

from __future__ import annotations

import math

import torch

from spec_zoo.draft import ROOT, SIBLING_MODES, Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Verdict, Verifier
from spec_zoo.sampling import logits_to_probs


def thresholds(probs: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """min(epsilon, delta * exp(-H(p))) per row of ``probs`` [..., V]."""
    entropy = -torch.special.xlogy(probs, probs).sum(-1)
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


class TypicalVerifier(Verifier):
    """epsilon: the hard threshold (Medusa's posterior_threshold, 0.09 in its demos);
    delta: the entropy-scaled one (Medusa's posterior_alpha, about sqrt(epsilon))."""

    name = "typical"
    lossless = False
    sibling_modes = SIBLING_MODES  # reads p only, never q: any way of drawing siblings will do

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3):
        if not 0.0 < epsilon < 1.0:
            raise ConfigError(f"verifier.epsilon={epsilon}; use a probability threshold in (0, 1), e.g. 0.09.")
        if delta <= 0.0:
            raise ConfigError(f"verifier.delta={delta}; use a positive weight, e.g. 0.3.")
        self.epsilon, self.delta = float(epsilon), float(delta)

    def verify(self, draft: Draft, target_logits: torch.Tensor, sampling, generator) -> Verdict:
        probs = logits_to_probs(target_logits, sampling)
        limit = thresholds(probs, self.epsilon, self.delta).tolist()
        tokens = draft.tokens.tolist()
        best, best_key = ROOT, (0, 0.0)
        score = {ROOT: 0.0}  # log-likelihood of the accepted path to each accepted node
        for i, parent in enumerate(draft.parents):  # topological order: a parent is judged first
            if parent not in score:
                continue
            p = float(probs[parent + 1, tokens[i]])
            if p > limit[parent + 1]:
                score[i] = score[parent] + math.log(p)
                key = (draft.depths[i] + 1, score[i])
                if key > best_key:
                    best, best_key = i, key
        path = draft.path_to(best) if best != ROOT else []
        nxt = int(target_logits[best + 1].argmax())
        return Verdict(path, nxt, bonus=not draft.children(best))
