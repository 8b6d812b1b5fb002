"""``drafter=cascade``: try member drafters in order, use the first that proposes.

Typical: ``drafter.members=[ngram,eagle]``: prompt lookup is free and, when it matches,
long; the EAGLE head covers the steps where the lookup finds nothing or has lately been
rejected. Members are named by their ``conf/drafter/*.yaml`` option names (composed with
Hydra, built with ``hydra.utils.instantiate``), given as dicts with ``_target_``, or, from
Python, as `Drafter` instances (`spec_zoo.drafters.composed`, shared with ``drafter=merge``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spec_zoo.draft import Draft
from spec_zoo.draft_length import TIME_DECAY
from spec_zoo.drafters.composed import ComposedDrafter, plain_container
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Verdict
from spec_zoo.lockstep import Steps
from spec_zoo.stats import StepStats

if TYPE_CHECKING:
    from spec_zoo.costs import CostTable

# the cascade's estimate of a member: tokens per step over cost per step, decayed counts
PRIOR_TOKENS, PRIOR_DRAFTED = 2.0, 1  # one pseudo-step: 1 drafted, accepted (optimistic: try it)
MEMBER_DECAY = 0.9  # weight of past steps per step (memory of ~10 steps); skipped members drift back to the prior


@dataclasses.dataclass
class MemberEvidence:
    """What a member's recent steps returned, decayed every step (`MEMBER_DECAY`)."""

    tokens: float = 0.0  # tokens its steps committed (1 + accepted)
    cost: float = 0.0  # those steps' cost in target forwards, as priced (`CascadeDrafter.step_cost`)
    timed_tokens: float = 0.0  # tokens committed by its timed steps (greedy runs with a cost table)
    seconds: float = 0.0  # draft + verify seconds of those timed steps

    def decay(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) * MEMBER_DECAY)


class CascadeDrafter(ComposedDrafter):
    """Asks members in order; the first non-empty draft is the step's draft.

    Its own adaptive rule skips a member whose recent steps did not pay: per member it
    keeps decayed counts of the tokens its steps committed (1 + accepted) and those
    steps' cost in target forwards, and estimates its speedup as committed tokens /
    cost. A step costs 1 + ``cost`` x drafted; with a measured cost table (`spec_zoo.costs`)
    it costs the table's t(n + 1)/t(1) for the n nodes scored plus the member's measured
    cost per drafted level (``spec-zoo costs drafter=<member>``) x its levels, a member
    without a measured cost keeping its configured one. A member below ``min_speedup`` is
    skipped; its counts fade every step, so it is asked again after a few. These prices are
    data, not the clock, so they hold in sampled runs too: a seeded run is reproducible.
    In greedy runs with a cost table (the text cannot depend on the choice there), a
    member's steps are priced by their measured time instead, in plain steps: seconds over
    t1, t1 being each step's scoring time over the table's t(M)/t(1); so a member whose
    drafting is dear on this machine (a long document, a loaded core) is priced at what it
    costs.

    members:     drafter option names (``[ngram, eagle]``), dicts with ``_target_``, or `Drafter`s.
    params:      per-member overrides, keyed by member name (``{ngram: {num_draft: 8}}``; a
                 name listed twice is keyed ``name_<position>`` the second time).
    costs:       per-member cost of one drafted token in target forwards (drafting it plus
                 scoring it); a member not listed uses its own configured ``token_cost``
                 (0.1 for drafters without one). A listed cost is used as given; an unlisted
                 member's measured drafting cost in the cost table replaces its ``token_cost``.
    min_speedup: skip a member whose estimated speedup is below this (1.0: drafting loses time).

    Exactness: which member drafts depends only on the past, and the chosen member's ``q``
    is passed on unchanged, so exact verifiers stay exact.
    """

    name = "cascade"

    def __init__(self, members, params=None, costs=None, min_speedup: float = 1.0,
                 _ancestry: tuple[type[ComposedDrafter], ...] = ()):
        self._costs, self.min_speedup = plain_container(costs) or {}, min_speedup
        super().__init__(members, params, _ancestry)
        self.costs = [float(self._costs.get(label, getattr(getattr(member, "length", None), "prior_cost", 0.1)))
                      for label, member in zip(self.labels, self.members)]
        self._chosen: int | None = None
        self._reset_evidence()

    def check(self, labels: list[str]) -> None:
        costs = self._costs
        if not isinstance(costs, Mapping) or set(costs) - set(labels):
            raise ConfigError(f"drafter.costs={costs!r}: give a dict member name -> cost per drafted token "
                              f"for members among {', '.join(labels)}, e.g. +drafter.costs.eagle=0.1.")
        for label, cost in costs.items():
            if not isinstance(cost, (int, float)) or not 0.0 <= cost < 1.0:
                raise ConfigError(f"drafter.costs.{label}={cost}; a cost per drafted token in target "
                                  "forwards is in [0, 1).")
        if not isinstance(self.min_speedup, (int, float)) or self.min_speedup < 0:
            raise ConfigError(f"drafter.min_speedup={self.min_speedup}; use a ratio >= 0 (1.0 = skip members "
                              "that lose time, 0 = never skip).")

    def _reset_evidence(self) -> None:
        self._evidence = [MemberEvidence() for _ in self.members]
        self._plain = [0.0, 0.0]  # decayed sum and weight of a plain step's seconds (t1)
        self._table: CostTable | None = None  # greedy runs: the table that lets measured time steer
        self._priced: CostTable | None = None  # any run: the table that prices steps
        self._timed_steps = 0

    def speedup(self, i: int) -> float:
        """Estimated tokens per target-forward-equivalent when member ``i`` drafts: from its
        measured seconds when timings may steer and were taken, else from counts and costs."""
        e = self._evidence[i]
        prior = self.step_cost(i, Draft.chain([0] * PRIOR_DRAFTED), self._priced)
        if self._table is not None and self._plain[1] > 0 and e.seconds > 0:
            return (PRIOR_TOKENS + e.timed_tokens) / (prior + e.seconds * self._plain[1] / self._plain[0])
        return (PRIOR_TOKENS + e.tokens) / (prior + e.cost)

    def step_cost(self, i: int, draft: Draft, table: CostTable | None) -> float:
        """What a step with member ``i``'s ``draft`` costs in target forwards: 1 + its cost x
        drafted tokens; with ``table``, the table's scoring cost plus the member's drafting,
        measured per level where the table has it (an unlisted member's)."""
        if table is None:
            return 1.0 + self.costs[i] * len(draft)
        levels = max(draft.depths) + 1 if len(draft) else 0
        key = getattr(getattr(self.members[i], "length", None), "cost_key", None)
        drafting = self.costs[i] if self.labels[i] in self._costs else table.draft_cost(key, self.costs[i])
        return table.relative(len(draft) + 1) + drafting * levels

    def level_cost(self, table) -> float:
        """The member that drafted last step (the first member before any has) drafts the next level."""
        return self.members[self._chosen or 0].level_cost(table)

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self._reset_evidence()
        self._chosen = None

    def drafting(self, state: DecodeState) -> Steps[Draft]:
        self._collect(state)
        self._chosen, self._priced = None, state.cost_table
        self._table = state.cost_table if state.timings_steer else None
        for i in range(len(self.members)):
            if self.speedup(i) < self.min_speedup:
                continue
            draft = yield from self._asking(i, state)
            if len(draft):
                self._chosen = i
                return draft
        return Draft.empty()

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        for evidence in self._evidence:
            evidence.decay()
        # the first step's time holds the prompt's prefill: not a sample of a step
        table = self._table if self._timed_steps > 0 else None
        self._timed_steps += 1
        if table is not None:
            self._plain = [self._plain[0] * TIME_DECAY + step.verify_s / table.relative(len(draft) + 1),
                           self._plain[1] * TIME_DECAY + 1.0]
        if self._chosen is not None and len(draft):
            e = self._evidence[self._chosen]
            e.tokens += 1.0 + len(verdict.path)
            e.cost += self.step_cost(self._chosen, draft, self._priced)
            if table is not None:
                e.timed_tokens += 1.0 + len(verdict.path)
                e.seconds += step.draft_s + step.verify_s
        super().on_commit(draft, verdict, step)
