"""Draft length: fixed, or adaptive by expected speedup.

The adaptive rule follows the analysis of Leviathan et al. (2023, section 3.5): if each
draft token is accepted with probability a (given its predecessors were) and each
drafted token costs c target forwards (scoring it in the batch, plus drafting it), a
k-token draft yields (1 + a + ... + a^k) tokens for (1 + c k) forwards' worth of time.
We keep a running estimate of a (per "bucket": a drafter may track separate estimates,
e.g. one per n-gram match length) and draft the k that maximises that ratio, which is
0 (do not draft) when acceptance is too low to pay for itself. The estimate grows after
fully accepted drafts and shrinks after rejections, so the length does too.

The cost c differs by an order of magnitude between machines (a GPU scores 8 tokens for
the price of 1; one CPU thread pays almost linearly), so with ``learn_cost`` it is
measured online: a decayed least-squares fit of step time against draft length,
t(k) = t0 (1 + c k), replaces the configured ``token_cost`` once the steps seen vary
enough in length to fit it.
"""

from __future__ import annotations

from spec_zoo.errors import ConfigError

PRIOR_ACCEPT, PRIOR_WEIGHT = 0.6, 1.0  # mild prior, so one early rejection does not stop drafting
DECAY = 0.9  # weight of past evidence per new observed token (memory of ~10 tokens)
TIME_DECAY = 0.97  # weight of past step timings per step (memory of ~30 steps)
MIN_SPREAD = 0.25  # variance of draft lengths needed before trusting the fitted cost


class DraftLength:
    """Chooses the draft length for the next step and learns from what was accepted."""

    def __init__(
        self,
        initial: int,
        adaptive: bool,
        maximum: int,
        token_cost: float = 0.1,
        learn_cost: bool = True,
        key: str = "drafter",
    ):
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
        self.initial, self.adaptive, self.maximum = initial, adaptive, maximum
        self.prior_cost, self.learn_cost = token_cost, learn_cost
        self._timing = [0.0] * 5  # decayed sums of 1, k, t, k^2, k t over steps
        self.reset()

    def reset(self) -> None:
        """Forget acceptance evidence (a new sequence); measured costs carry over."""
        self._evidence: dict[object, list[float]] = {}  # bucket -> [accepted, rejected] (decayed counts)
        self._first_step = True  # its time includes the prompt's prefill: not a sample of t(k)

    @property
    def token_cost(self) -> float:
        """Cost of one drafted token in target forwards: fitted when possible, else configured."""
        w, sk, st, skk, skt = self._timing
        if not self.learn_cost or w < 5:
            return self.prior_cost
        mean_k, mean_t = sk / w, st / w
        spread = skk / w - mean_k**2
        if spread < MIN_SPREAD:
            return self.prior_cost
        slope = (skt / w - mean_k * mean_t) / spread
        t0 = mean_t - slope * mean_k
        if t0 <= 0:
            return self.prior_cost
        return min(max(slope / t0, 0.0), 0.99)

    def acceptance(self, bucket: object = None) -> float:
        """Estimated probability that a draft token is accepted given its predecessors were."""
        ok, bad = self._evidence.get(bucket, (0.0, 0.0))
        return (ok + PRIOR_ACCEPT * PRIOR_WEIGHT) / (ok + bad + PRIOR_WEIGHT)

    def choose(self, bucket: object = None) -> int:
        """Tokens to draft now; 0 means drafting is not expected to pay off."""
        if not self.adaptive or bucket not in self._evidence:
            return self.initial
        a, cost = self.acceptance(bucket), self.token_cost
        best_k, best, expected = 0, 1.0, 1.0
        for k in range(1, self.maximum + 1):
            expected += a**k
            gain = expected / (1.0 + cost * k)
            if gain > best:
                best_k, best = k, gain
        return best_k

    def update(self, drafted: int, accepted: int, bucket: object = None, seconds: float | None = None) -> None:
        """Learn from one verified chain: ``accepted`` successes, then one failure unless
        all passed; ``seconds`` (draft + verify time of the step) feeds the cost fit."""
        if seconds is not None and not self._first_step:
            for i, x in enumerate((1.0, drafted, seconds, drafted * drafted, drafted * seconds)):
                self._timing[i] = self._timing[i] * TIME_DECAY + x
        self._first_step = False
        if drafted == 0:
            return
        ok, bad = self._evidence.get(bucket, (0.0, 0.0))
        rejected = int(accepted < drafted)
        fade = DECAY ** (accepted + rejected)
        self._evidence[bucket] = [ok * fade + accepted, bad * fade + rejected]
