"""Draft length: fixed, or adaptive by expected speedup.

The adaptive rule follows the analysis of Leviathan et al. (2023, section 3.5): if each
draft token is accepted with probability a (given its predecessors were) and each
drafted token costs c target forwards (scoring it in the batch, plus drafting it), a
k-token draft yields (1 + a + ... + a^k) tokens for (1 + c k) forwards' worth of time.
We keep a running estimate of a (per "bucket": a drafter may track separate estimates,
e.g. one per n-gram match length) and draft the k that maximises that ratio, which is
0 (do not draft) when acceptance is too low to pay for itself. The estimate grows after
fully accepted drafts and shrinks after rejections, so the length does too.

The cost differs by an order of magnitude between machines (a GPU scores 8 tokens for
the price of 1; a CPU may switch from a matrix-vector to a slower matrix-matrix kernel as
soon as a second token is scored), so with ``learn_cost`` it is measured online: a
decayed least-squares fit of step time against draft length,
t(k) = t0 (1 + jump [k > 0] + c k), replaces the configured ``token_cost`` (c, with no
jump) once the steps seen vary enough in length to identify it. The ratio maximised is
then (1 + a + ... + a^k) / (1 + jump [k > 0] + c k).

The drafting itself is timed apart (``draft_seconds``), so a draft's own cost per level is known
once t(1) is: from the cost table, else from a plain step the rule asks for (a probe, `PROBE_AFTER`,
drafting nothing), and a draft is never priced below it. A draft that always runs at one length
gives the fit nothing to tell its cost by: every `PROBE_EVERY`-th step then probes, so it has two.

When the target carries a measured cost table (`spec_zoo.costs`, e.g. the compiled
runtime's stepwise curve: 4 scored tokens cost what 1 does, 5 cost 1.7x), the scoring part
of a step's cost comes from it instead of the fit: the ratio maximised is
(1 + a + ... + a^k) / (t(k + 1) / t(1) + c k), c counting the drafting alone: the drafter's
cost per drafted level measured by ``spec-zoo costs drafter=...`` into the same table
(`CostTable.drafts`, under ``cost_key``) where there is one, else, in greedy runs, the drafting
time of the steps seen per drafted level over the table's t(1) (`draft_cost`), else the configured
``token_cost``.

Timings steer the length only where they cannot change the text: in greedy decoding, whose
output is the target's argmax whatever was drafted. When sampling, the draft length decides
which random draws go where, so a clock-driven length would make a seeded run give a
different text each time; there the decode state says so (`DecodeState.timings_steer`), the
fit is off and the configured ``token_cost``, in target forwards, is used as is: same seed,
same output. The cost table reaches the rule the same way (`DecodeState.cost_table`), in
sampled runs too: it is stored data, not the clock, so a seed still gives one text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spec_zoo.draft import MAX_NODES
from spec_zoo.errors import ConfigError

if TYPE_CHECKING:
    from spec_zoo.interfaces import DecodeState

CHAIN_PRIOR_ACCEPT, CHAIN_PRIOR_WEIGHT = 0.6, 1.0  # mild prior, so one early rejection does not stop drafting
CHAIN_DECAY = 0.9  # weight of past evidence per new observed token (memory of ~10 tokens)
TIME_DECAY = 0.97  # weight of past step timings per step (memory of ~30 steps)
MIN_STEPS = 8  # timed steps before a fit is trusted
#: with no cost table, t(1) is timed by a plain step: the first after `PROBE_AFTER` timed drafting steps, then every
#: `PROBE_EVERY`-th while the fit cannot tell the cost (a draft always at one length, a good one at max_draft);
#: issue 62: the 4-bit copy, 1.05 t(1) a level, kept drafting 16 at the prior cost and ran at 0.53x plain
PROBE_AFTER, PROBE_EVERY = 3, 16


class Acceptance:
    """A running per-level acceptance: the chance that a draft level is accepted given the
    levels above it were (decayed counts under a mild prior). One per bucket of a drafter's
    `DraftLength`, and one per sequence for a batch's policy (`spec_zoo.batch_policy`)."""

    def __init__(self):
        self.ok = self.bad = 0.0

    @property
    def rate(self) -> float:
        return (self.ok + CHAIN_PRIOR_ACCEPT * CHAIN_PRIOR_WEIGHT) / (self.ok + self.bad + CHAIN_PRIOR_WEIGHT)

    def update(self, drafted: int, accepted: int) -> None:
        """Learn from one scored draft of ``drafted`` levels of which ``accepted`` held: that many
        successes, then one failure unless all passed; an empty draft lets old evidence fade, so
        drafting is retried later."""
        rejected = int(accepted < drafted)
        fade = CHAIN_DECAY ** (accepted + rejected if drafted else 1)
        self.ok, self.bad = self.ok * fade + accepted, self.bad * fade + rejected


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
        for name, length in (("num_draft", initial), ("max_draft", maximum if adaptive else 0)):
            if length > MAX_NODES:  # a draft is scored in one target forward, as a tree is
                raise ConfigError(f"{key}.{name}: {length} tokens per draft is more than the {MAX_NODES} one target "
                                  f"forward may score; use a shorter draft, e.g. {key}.{name}=8.")
        if not 0.0 <= token_cost < 1.0:
            raise ConfigError(
                f"{key}.token_cost={token_cost}; it is the cost of one drafted token in target forwards, in [0, 1)."
            )
        self.initial, self.adaptive, self.maximum = initial, adaptive, maximum
        self.prior_cost, self.learn_cost = token_cost, learn_cost
        # the drafter's key in a cost table's measured draft costs (its attach sets it)
        self.cost_key: str | None = None
        # decayed normal equations of the fit t = b0 + b1 [k > 0] + b2 k
        self._xtx = torch.zeros(3, 3, dtype=torch.float64)
        self._xty = torch.zeros(3, dtype=torch.float64)
        self._drafting = [0.0, 0.0, 0]  # decayed drafting seconds, drafted levels, steps: the draft's own cost
        self._plain = [0.0, 0.0]  # decayed seconds and count of the steps that drafted nothing: t(1)
        self._since_probe = 0
        self.reset()

    def reset(self) -> None:
        """Forget acceptance evidence (a new sequence); measured costs carry over."""
        self._evidence: dict[object, Acceptance] = {}  # bucket -> its decayed counts
        self._first_step = True  # its time includes the prompt's prefill: not a sample of t(k)

    def costs(self, timings_steer: bool = True) -> tuple[float, float]:
        """(jump, per-token cost) of drafting, in target forwards: fitted when the timed
        steps identify them and timings may steer (greedy runs), else (0, ``token_cost``)."""
        prior = (0.0, self.prior_cost)
        if not self.learn_cost or not timings_steer or self._xtx[0, 0] < MIN_STEPS:
            return prior
        fit = self._fit()
        if fit is None or fit[0] <= 0:
            return prior
        return max(float(fit[1] / fit[0]), 0.0), min(max(float(fit[2] / fit[0]), 0.0), 0.99)

    def _fit(self) -> torch.Tensor | None:
        fit = _solve(self._xtx, self._xty)  # jump and slope
        if fit is None:  # only two distinct lengths seen: no jump term
            fit = _solve(self._xtx[::2, ::2], self._xty[::2])
            fit = None if fit is None else torch.stack([fit[0], fit.new_zeros(()), fit[1]])
        return fit

    def draft_cost(self, table, timings_steer: bool = True) -> float:
        """One drafted level's cost in the table's t(1): the table's measure of this drafter, else the
        drafting time seen (`_own_cost`), else ``token_cost``."""
        seen = self._own_cost(table.seconds[0], timings_steer)
        return table.draft_cost(self.cost_key, self.prior_cost if seen is None else seen)

    def _own_cost(self, t1: float | None, timings_steer: bool) -> float | None:
        """The drafting seconds per level of the steps seen over ``t1`` (greedy runs, `PROBE_AFTER`
        drafting steps seen), else None."""
        seconds, levels, steps = self._drafting
        if not (self.learn_cost and timings_steer and steps >= PROBE_AFTER and levels > 0 and t1):
            return None
        return seconds / levels / t1

    def _probe(self, timings_steer: bool) -> bool:
        """Whether this step should draft nothing to time t(1): none timed yet, or the fit cannot tell the cost."""
        if not (self.learn_cost and timings_steer and self._drafting[2] >= PROBE_AFTER):
            return False
        if not self._plain[1]:
            return True
        if self._xtx[0, 0] < MIN_STEPS or self._fit() is not None:
            return False
        self._since_probe = (self._since_probe + 1) % PROBE_EVERY
        return self._since_probe == 0

    def acceptance(self, bucket: object = None) -> float:
        """Estimated probability that a draft token is accepted given its predecessors were."""
        return (self._evidence.get(bucket) or Acceptance()).rate

    def choose(self, bucket: object = None, state: DecodeState | None = None) -> int:
        """Tokens to draft now; 0 means drafting is not expected to pay off. ``state`` says
        whether timings may steer and carries the cost table (None: they may, no table)."""
        table = state.cost_table if state is not None else None
        if not self.adaptive or (bucket not in self._evidence and not (table and self.cost_key in table.drafts)):
            return self.initial  # a stored measure of this drafter prices even its first draft (at the prior rate)
        steer = state is None or state.timings_steer
        a, (jump, cost) = self.acceptance(bucket), self.costs(steer)
        if table is None and self._probe(steer):
            return 0
        drafting = self.draft_cost(table, steer) if table else self.prior_cost
        if table is None:  # a draft's own cost per level bounds what a drafted level costs
            t1 = self._plain[0] / self._plain[1] if self._plain[1] else None
            cost = max(cost, min(self._own_cost(t1, steer) or 0.0, 0.99))
        best_k, best, expected = 0, 1.0, 1.0
        for k in range(1, self.maximum + 1):
            expected += a**k
            step = table.relative(k + 1) + drafting * k if table else 1.0 + jump + cost * k
            gain = expected / step
            if gain > best:
                best_k, best = k, gain
        return best_k

    def update(self, drafted: int, accepted: int, bucket: object = None, seconds: float | None = None,
               draft_seconds: float | None = None) -> None:
        """Learn from one verified chain: ``accepted`` successes, then one failure unless
        all passed; ``seconds`` (draft + verify time of the step) feeds the cost fit, ``draft_seconds``
        (its drafting alone) the measured cost of a drafted level (`draft_cost`)."""
        if seconds is not None and not self._first_step:
            x = torch.tensor([1.0, float(drafted > 0), float(drafted)], dtype=torch.float64)
            self._xtx.mul_(TIME_DECAY).add_(torch.outer(x, x))
            self._xty.mul_(TIME_DECAY).add_(x * seconds)
        if draft_seconds is not None and drafted and not self._first_step:
            s, n, steps = self._drafting
            self._drafting = [s * TIME_DECAY + draft_seconds, n * TIME_DECAY + drafted, steps + 1]
        if seconds is not None and not drafted and not self._first_step:
            self._plain = [self._plain[0] * TIME_DECAY + seconds, self._plain[1] * TIME_DECAY + 1]
        self._first_step = False
        if drafted == 0 and bucket not in self._evidence:  # nothing to learn, nothing to fade
            return
        self._evidence.setdefault(bucket, Acceptance()).update(drafted, accepted)


def _solve(xtx: torch.Tensor, xty: torch.Tensor) -> torch.Tensor | None:
    """Least-squares coefficients, or None when the design does not identify them."""
    scale = xtx.diagonal().clamp(min=1e-12).sqrt()
    normed = xtx / scale[:, None] / scale[None, :]
    if torch.linalg.eigvalsh(normed).min() < 1e-3:
        return None
    return torch.linalg.solve(xtx, xty)
