"""Draft length: fixed, or adaptive by expected speedup.

The adaptive rule follows the analysis of Leviathan et al. (2023, section 3.5): if each
draft token is accepted with probability a (given its predecessors were) and each
drafted token costs c target forwards (scoring it in the batch, plus drafting it), a
k-token draft yields (1 + a + ... + a^k) tokens for (1 + c k) forwards' worth of time.
We keep a running estimate of a (per "bucket": a drafter may track separate estimates,
e.g. one per n-gram match length) and draft the k that maximises that ratio, which is
0 (do not draft) when acceptance is too low to pay for itself. The estimate grows after
fully accepted drafts and shrinks after rejections, so the length does too.
"""

from __future__ import annotations

from spec_zoo.errors import ConfigError

PRIOR_ACCEPT, PRIOR_WEIGHT = 0.6, 1.0  # mild prior, so one early rejection does not stop drafting
DECAY = 0.9  # weight of past evidence per new observed token (memory of ~10 tokens)


class DraftLength:
    """Chooses the draft length for the next step and learns from what was accepted."""

    def __init__(self, initial: int, adaptive: bool, maximum: int, token_cost: float = 0.1, key: str = "drafter"):
        if initial <= 0:
            raise ConfigError(f"{key}.num_draft={initial}; the draft length must be a positive integer (e.g. 4).")
        if adaptive and maximum < initial:
            raise ConfigError(
                f"{key}.max_draft={maximum} is below {key}.num_draft={initial}; raise max_draft or lower num_draft."
            )
        if not 0.0 <= token_cost < 1.0:
            raise ConfigError(
                f"{key}.token_cost={token_cost}; it is the cost of one drafted token in target forwards, in [0, 1)."
            )
        self.initial, self.adaptive, self.maximum, self.token_cost = initial, adaptive, maximum, token_cost
        self.reset()

    def reset(self) -> None:
        self._evidence: dict[object, list[float]] = {}  # bucket -> [accepted, rejected] (decayed counts)

    def acceptance(self, bucket: object = None) -> float:
        """Estimated probability that a draft token is accepted given its predecessors were."""
        ok, bad = self._evidence.get(bucket, (0.0, 0.0))
        return (ok + PRIOR_ACCEPT * PRIOR_WEIGHT) / (ok + bad + PRIOR_WEIGHT)

    def choose(self, bucket: object = None) -> int:
        """Tokens to draft now; 0 means drafting is not expected to pay off."""
        if not self.adaptive or bucket not in self._evidence:
            return self.initial
        a = self.acceptance(bucket)
        best_k, best, expected = 0, 1.0, 1.0
        for k in range(1, self.maximum + 1):
            expected += a**k
            gain = expected / (1.0 + self.token_cost * k)
            if gain > best:
                best_k, best = k, gain
        return best_k

    def update(self, drafted: int, accepted: int, bucket: object = None) -> None:
        """Learn from one verified chain: ``accepted`` successes, then one failure unless all passed."""
        if drafted == 0:
            return
        ok, bad = self._evidence.get(bucket, (0.0, 0.0))
        rejected = int(accepted < drafted)
        fade = DECAY ** (accepted + rejected)
        self._evidence[bucket] = [ok * fade + accepted, bad * fade + rejected]
