"""What every model-based drafter shares (small_model, early_exit, eagle, medusa): the
token-by-token drafting loop, the step bookkeeping of an adaptive draft length, and what
its tree policy says about its drafts (their caches follow the committed tokens with
`spec_zoo.runtime.target.follow`). One copy, so a fix reaches all of them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch

from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.lockstep import Steps, drive
from spec_zoo.sampling import draft_token, drafts_sampled
from spec_zoo.stats import StepStats

if TYPE_CHECKING:
    from spec_zoo.trees import TreePolicy


class ChainDrafter(Drafter):
    """A drafter that proposes a chain token by token with an adaptive (or fixed) length.

    Subclasses set ``self.length`` (a `DraftLength`) and ``self.sample_mode``; they draft with
    `draft_chain` and inherit the step bookkeeping of ``on_commit``.
    """

    length: DraftLength
    sample_mode: str | bool = "auto"
    tree: TreePolicy | None = None  # a tree policy (`spec_zoo.trees`) when the drafter drafts trees, else None: chains
    slot = 0  # the sequence's place in a batch (`for_sequence`): its cache entry in a draft model or compiled head

    @property  # computes the attribute Drafter declares (ComposedDrafter sets it per instance)
    def drafts_trees(self) -> bool:  # type: ignore[override]
        return self.tree is not None and self.tree.branches

    def for_sequence(self, slot: int) -> ChainDrafter:
        """(For a subclass that declares ``batches``.) The same models, settings and compiled graphs;
        its own draft-length estimates and tree policy (``auto`` learns acceptance per sequence).
        Caches of its own are the subclass's to make fresh in `begin` (entry ``slot`` of a shared one)."""
        twin = copy.copy(self)
        twin.length, twin.tree, twin.slot = copy.deepcopy(self.length), copy.deepcopy(self.tree), slot
        return twin

    @property  # as drafts_trees
    def sibling_modes(self) -> tuple[str, ...]:  # type: ignore[override]
        """How siblings are drawn: a chain's q is its row (sampled) or one-hot; a tree's, its policy's."""
        if self.tree is None:
            return ("iid", "deterministic")
        return tuple({m for sampled in (True, False) for m in self.tree.sibling_modes(sampled)})

    def draft_chain(
        self,
        state: DecodeState,
        logits: torch.Tensor,
        k: int,
        advance: Callable[[int, bool], torch.Tensor | None],
        stop: Callable[[torch.Tensor], bool] | None = None,
        advance_last: bool = False,
    ) -> Draft:
        """Up to ``k`` tokens: pick one from ``logits`` (sampled, with its q recorded, or the
        argmax), then ``advance(token, more)`` feeds it and returns the logits after it (only
        needed when ``more`` tokens follow). ``stop(logits)`` ends the chain early;
        ``advance_last`` also feeds the last token (for a drafter whose work on it the target
        reuses)."""
        return drive(self.chain_steps(state, logits, k, stop, advance_last), lambda ask: advance(*ask))

    def chain_steps(self, state: DecodeState, logits: torch.Tensor, k: int,
                    stop: Callable[[torch.Tensor], bool] | None = None, advance_last: bool = False) -> Steps[Draft]:
        """`draft_chain` as steps (`spec_zoo.lockstep`): yields (token, more) where it would call
        ``advance`` and is sent the logits after the token."""
        sampled = drafts_sampled(self.sample_mode, state.sampling)
        drafted, qs = [], []
        for i in range(k):
            if stop is not None and stop(logits):
                break
            token, q = draft_token(logits, sampled, state.sampling, state.generator)
            qs += [q] if q is not None else []
            drafted.append(token)
            if advance_last or i + 1 < k:
                logits = cast(torch.Tensor, (yield token, i + 1 < k))  # None only after the last token
        return Draft.chain(drafted, torch.stack(qs) if qs else None)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        if self.tree is None:  # the length rule models chains
            self.length.update(len(draft), len(verdict.path), seconds=step.draft_s + step.verify_s,
                               draft_seconds=step.draft_s)
        else:
            self.tree.observe(draft, verdict)
