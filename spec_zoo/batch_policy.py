"""How deep each sequence's draft is scored when several requests share a forward.

Alone, a drafter prices its own draft length against t(k + 1) (`spec_zoo.draft_length`). In a
batch of B sequences the step costs t(R) for all R rows together, so every draft token is paid
by the whole batch: a draft worth scoring alone may not be worth its rows next to seven others
(vLLM's measured reversals at high load). A policy cuts each proposed draft to a depth before
the batch is scored:

- `Goodput` (SmartSpec, arXiv 2406.14066): the depths that maximise the batch's expected
  committed tokens per unit of time, sum_i (1 + a_i + ... + a_i^k_i) / (t(R) + sum_i d_i k_i),
  with a_i each sequence's running acceptance, t the target's measured cost table and d_i what
  drafting a level costs its drafter (before drafting; once drafted, that time is spent); all
  zero (plain decoding) when no draft pays for its rows. Sequences whose drafters draft together
  (`spec_zoo.lockstep`: one call per level for all of them) pay a level's drafting once between
  them, not once each.
- `Schedule` (TensorRT-LLM's ``draft_len_schedule``): a fixed longest depth per number of
  live sequences, the alternative to ablate against.

Cutting a draft never changes a greedy output (the verifier keeps the target's argmax), so a
policy steers greedy runs only: when sampling, which draws a request makes depends on its draft,
and its draws must not depend on its neighbours (docs/batching.md's guarantee).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from spec_zoo.costs import CostTable
from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError


class BatchPolicy(ABC):
    """Chooses, for the drafts of the live sequences, how many levels of each to score."""

    def depths(self, drafts: Sequence[Draft], acceptance: Sequence[float], table: CostTable | None) -> list[int]:
        """The depth to cut each draft to (at most its own), given each sequence's acceptance
        and the target's cost table at the batch's context (None when there is none)."""
        return self.levels([_rows_per_level(d) for d in drafts], acceptance, table)

    def bounds(self, caps: Sequence[int], acceptance: Sequence[float], table: CostTable | None,
               drafting: Sequence[float] | None = None, shared: Sequence[bool] | None = None) -> list[int]:
        """Before drafting: the deepest chain worth drafting for each sequence (at most ``caps[i]``),
        so that no drafter spends time on levels the batch would not score (`depths` then cuts
        the drafts made). ``drafting[i]``: what drafting one level costs sequence i's drafter, in
        target forwards (`Drafter.level_cost`); afterwards that time is spent, so `depths` leaves it out.
        ``shared[i]``: sequence i drafts together with the others so marked (`Drafter.drafts_together`),
        so a level they draft costs one call between them."""
        return self.levels([[1] * cap for cap in caps], acceptance, table, drafting, shared)

    @abstractmethod
    def levels(self, level_rows: Sequence[list[int]], acceptance: Sequence[float],
               table: CostTable | None, drafting: Sequence[float] | None = None,
               shared: Sequence[bool] | None = None) -> list[int]:
        """How many levels of each sequence's draft to score, given its nodes per level (and what
        drafting a level costs each, when it is still to be done, and who shares those calls)."""


class Goodput(BatchPolicy):
    """The depths of greatest expected committed tokens per second over the whole batch.

    Each level added to sequence i gains a_i^(k + 1) expected tokens and costs its nodes' rows
    (and, before drafting, its drafting, counted in rows at the table's mean cost of a row);
    taking the levels in order of gain per row gives the best set of levels for each row count
    (a_i^k falls with k, so no sequence's level is taken before its parent), and the policy keeps
    the prefix whose ratio to its cost, t(R) plus the drafting, is highest. Without a cost table
    it cannot price rows and leaves every draft as proposed."""

    #: levels priced before drafting (`bounds`); a sequence given all of them is not bounded
    PRICED_LEVELS = 16

    def bounds(self, caps, acceptance, table, drafting=None, shared=None):
        if table is None:
            return list(caps)
        priced = super().bounds([min(cap, self.PRICED_LEVELS) for cap in caps], acceptance, table, drafting,
                                shared)
        return [cap if bound == min(cap, self.PRICED_LEVELS) else bound for cap, bound in zip(caps, priced)]

    def levels(self, level_rows, acceptance, table, drafting=None, shared=None):
        if table is None or len(level_rows) < 2:  # alone, the drafter's own length rule priced its draft
            return [len(rows) for rows in level_rows]
        costs = list(drafting) if drafting is not None else [0.0] * len(level_rows)  # per level drafted
        together = list(shared) if shared is not None else [False] * len(level_rows)
        # a level's price in rows: its nodes, and its drafting at the table's mean cost of a row (a
        # shared level's spread over the sequences sharing it, to order the levels; `spent` is exact)
        unit = max((table.relative(len(table.seconds)) - 1.0) / max(len(table.seconds) - 1, 1), 1e-6)
        sharing = max(sum(together), 1)
        extra = [c / unit / (sharing if together[i] else 1) for i, c in enumerate(costs)]
        called: list[float] = []  # the shared calls' cost at each level drafted so far
        heap = [(-a / (rows[0] + extra[i]), i)
                for i, (a, rows) in enumerate(zip(acceptance, level_rows, strict=True)) if rows]
        heapq.heapify(heap)
        rows, gain = len(level_rows), float(len(level_rows))  # every sequence scores its last committed token
        taken, spent = [0] * len(level_rows), 0.0  # spent: drafting still to be done, in target forwards
        best, best_ratio = list(taken), gain / table.relative(rows)
        while heap:
            _, i = heapq.heappop(heap)
            k = taken[i]
            rows += level_rows[i][k]
            gain += acceptance[i] ** (k + 1)
            if together[i]:  # the level's one call costs the dearest drafter taking it
                called += [0.0] * (k + 1 - len(called))
                spent += max(costs[i] - called[k], 0.0)
                called[k] = max(called[k], costs[i])
            else:
                spent += costs[i]
            taken[i] = k + 1
            if k + 1 < len(level_rows[i]):
                heapq.heappush(heap, (-acceptance[i] ** (k + 2) / (level_rows[i][k + 1] + extra[i]), i))
            if (ratio := gain / (table.relative(rows) + spent)) > best_ratio:
                best, best_ratio = list(taken), ratio
        return best


class Schedule(BatchPolicy):
    """A fixed longest depth by the number of live sequences: the entry of the largest batch
    size not above it (``{1: 8, 4: 4, 8: 2, 16: 0}``: 3 live sequences draft up to 8 levels)."""

    def __init__(self, lengths: Mapping[int, int]):
        try:
            self.lengths = sorted((int(b), int(k)) for b, k in lengths.items())
        except (TypeError, ValueError):
            self.lengths = []
        if not self.lengths or any(b < 1 or k < 0 for b, k in self.lengths):
            raise ConfigError(f"batch_policy: {dict(lengths)!r} is not a schedule of batch size -> longest draft; "
                              "pass e.g. batch_policy='{1: 8, 4: 4, 8: 2, 16: 0}' (sizes >= 1, lengths >= 0).")

    def levels(self, level_rows, acceptance, table, drafting=None, shared=None):
        cap = next((k for b, k in reversed(self.lengths) if b <= len(level_rows)), None)
        return [len(rows) if cap is None else min(len(rows), cap) for rows in level_rows]


def batch_policy(value: str | Mapping | None) -> BatchPolicy | None:
    """The policy a config names: ``goodput``, ``drafter`` (None: each draft scored as proposed)
    or a schedule mapping."""
    if value is None or value == "drafter":
        return None
    if value == "goodput":
        return Goodput()
    if isinstance(value, Mapping):
        return Schedule(value)
    raise ConfigError(f"batch_policy: {value!r} is not a policy; pass goodput, drafter, "
                      "or a schedule such as batch_policy='{1: 8, 4: 4, 8: 2, 16: 0}'.")


def _rows_per_level(draft: Draft) -> list[int]:
    """How many nodes each level of the draft holds (a chain: one per level)."""
    counts = [0] * draft.depth
    for d in draft.depths:
        counts[d] += 1
    return counts
