"""The two strategy interfaces, and the typed values that cross between them.

A drafter and a verifier never see each other: the decode loop hands the drafter a
`DecodeState`, gets a `Draft`, has the target score it, and hands draft + target
logits to the verifier, which returns a `Verdict`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.lockstep import Steps
from spec_zoo.sampling import SamplingParams
from spec_zoo.stats import StepStats

if TYPE_CHECKING:
    from spec_zoo.costs import CostTable
    from spec_zoo.runtime.target import Target


@dataclass
class DecodeState:
    """What a drafter may look at when it proposes.

    tokens:       the committed sequence (prompt + generated); its last token is not
                  yet in the target's KV cache and is the parent of every first-level node.
    prompt_len:   how many of ``tokens`` are the prompt.
    max_depth:    the deepest draft worth scoring (tokens left before max_new_tokens, minus
                  the one the verifier adds); deeper nodes are cut by the loop.
    sampling:     the sampling parameters of this run (a drafter may sample with them).
    generator:    the run's random generator; use it for every random draw (determinism).
    target_hidden: last-layer hidden states of the target at the positions committed by
                  the previous step ([m, H]), only for drafters with ``needs_target_hidden``;
                  [m, k * H] (the states entering those k layers) when it names layers.
    timings_steer: whether measured time may steer drafting: only in greedy runs, whose text
                  cannot depend on it (a sampled run's draws must not follow the clock, so that
                  a seed gives one text).
    cost_table:   the target's measured scoring costs t(M) and drafters' drafting costs
                  (`spec_zoo.costs`) when a table was given to the decoder, else None: drafters
                  and tree policies price steps with it, in sampled runs too (a stored table,
                  not the clock: a seed still gives one text on this machine).
    draft_logits: the target's logits of the previous step's scored rows ([n + 1, V]: row 0
                  after the last committed token, row i + 1 after node i of that draft), only
                  for drafters with ``needs_draft_logits`` (Jacobi iterations read them).
    request_id:   the request this sequence serves (`SpeculativeDecoder.generate`'s
                  ``request_id``; the benchmark passes its question id), or None. A drafter that
                  learns across requests (``drafter=suffix``) hides what the same request
                  produced before, so a repeated measurement never drafts its own answer.
    """

    tokens: list[int]
    prompt_len: int
    max_depth: int
    sampling: SamplingParams
    generator: torch.Generator
    target_hidden: torch.Tensor | None = None
    timings_steer: bool = True
    cost_table: CostTable | None = None
    draft_logits: torch.Tensor | None = None
    request_id: Hashable | None = None


@dataclass
class Verdict:
    """The verifier's decision.

    path:       accepted node indices, from a first-level node down (empty: none accepted).
    next_token: the one token the target adds after the path: the *bonus* token when
                the path ends at a leaf (no child was rejected), else the *recovered* token.
    bonus:      True when ``next_token`` is a bonus token (nothing was rejected).
    """

    path: list[int]
    next_token: int
    bonus: bool


class Drafter(ABC):
    """Proposes tokens after the committed sequence.

    Contract: ``propose`` returns a `Draft` whose ``probs`` (when not None) are the exact
    distributions its tokens were drawn from, so exact verifiers stay exact. A drafter
    keeps whatever state it needs (caches, tables) in sync with ``state.tokens`` itself;
    ``on_commit`` tells it what was accepted, and what the step cost, so it can adapt.
    """

    #: config name of this drafter (used in stats and benchmark records)
    name: str = "drafter"
    #: set True to receive ``state.target_hidden`` (Medusa/EAGLE-like heads, early exit), or a
    #: tuple of layer ids for the states entering those layers (EAGLE-3 heads)
    needs_target_hidden: bool | tuple[int, ...] = False
    #: set True to receive ``state.draft_logits``: what the target predicted after every
    #: node of the previous draft (lookahead decoding's Jacobi step)
    needs_draft_logits: bool = False
    #: True when drafts may branch (chain-only verifiers refuse such a drafter up front)
    drafts_trees: bool = False
    #: the ``Draft.siblings`` modes its drafts may use (verifiers refuse what they cannot verify)
    sibling_modes: tuple[str, ...] = ("iid", "deterministic")
    #: True when `for_sequence` gives it per-sequence state, so a batch interleaves its
    #: requests' steps; False: a batch decodes its requests one after another through it
    batches: bool = False
    #: True when its `drafting` asks for model calls a batch's sequences share (one call per draft
    #: level for all of them, `spec_zoo.lockstep`); False: each sequence drafts on its own
    drafts_together: bool = False
    #: its keys that name a file or folder it loads (a trained method's artefact): a load that
    #: fails is reported against the first one set
    artefact_keys: tuple[str, ...] = ("path",)

    def attach(self, target: Target) -> None:
        """Called once when a decoder is built: check compatibility with the target
        (vocabulary, device) and grab what is shared with it. Raise `ConfigError` on mismatch."""

    def hold(self, sequences: int) -> None:
        """Called before a batch's first `for_sequence` with how many sequences decode at once:
        a drafter whose draft model keeps a cache entry per sequence makes room for them here."""

    def for_sequence(self, slot: int) -> Drafter:
        """A drafter for one more sequence of a batch (only called when ``batches``), decoded in
        place ``slot`` (0 <= slot < the ``sequences`` given to `hold`; a later request may take the
        place of one that ended): it shares this one's models and tables but none of its
        per-sequence state (caches, indexes, acceptance estimates), so each sequence drafts
        exactly as it would alone. A draft model's cache entry for the sequence is entry ``slot``."""
        raise NotImplementedError(f"drafter={self.name} declares batches=True but has no for_sequence")

    def level_cost(self, table: CostTable | None) -> float:
        """What drafting one more level costs, in target forwards: what a batch policy weighs
        before it lets a sequence draft deeper. A drafter with a draft-length rule (``length``,
        `spec_zoo.draft_length.DraftLength`) costs what that rule prices (its measured cost in
        ``table``, else its ``token_cost``); one without, nothing."""
        length = getattr(self, "length", None)
        if length is None:
            return 0.0
        return table.draft_cost(length.cost_key, length.prior_cost) if table is not None else length.prior_cost

    def begin(self, state: DecodeState) -> None:
        """Called at the start of each sequence, before the first ``propose``."""

    def end(self, state: DecodeState) -> None:
        """Called when a sequence has ended (its last tokens committed): where a drafter files
        what the sequence produced (SuffixDecoding's cache, saved to its ``cache_path``)."""

    @abstractmethod
    def propose(self, state: DecodeState) -> Draft:
        """Return the draft to score after ``state.tokens`` (may be empty)."""

    def drafting(self, state: DecodeState) -> Steps[Draft]:
        """`propose` as steps (`spec_zoo.lockstep`): a generator that yields each model call it
        wants shared with the batch's other sequences and is sent its answer. Here no call is
        shared: the draft is made in one step. A drafter with ``drafts_together`` overrides it
        (and its ``propose`` drives it alone)."""
        return self.propose(state)
        yield  # a generator that asks for nothing

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        """Called after each step with the draft, what the verifier accepted, and the
        step's counts and timings (what an adaptive drafter learns its costs from)."""


class Verifier(ABC):
    """Decides which draft path is accepted and which extra token the target adds.

    Contract: with ``lossless = True`` the committed tokens follow exactly the target's
    distribution under the sampling parameters (greedy: token-for-token identity).
    """

    name: str = "verifier"
    lossless: bool = True
    #: True when ``verifier=auto`` chose this rule (summaries say so)
    auto: bool = False
    #: the ``Draft.siblings`` modes this rule is exact for (`check_drafter` refuses others)
    sibling_modes: tuple[str, ...] = ("iid", "deterministic")

    def check(self, sampling: SamplingParams) -> None:
        """Raise `ConfigError` when this verifier cannot honour ``sampling``."""

    def check_drafter(self, drafter: Drafter) -> None:
        """Raise `ConfigError` when this verifier cannot read what ``drafter`` proposes
        (e.g. a chain-only rule and a tree drafter), before any decoding. The base rule
        refuses sibling sampling this verifier is not exact for; an override calls it."""
        if unknown := [m for m in drafter.sibling_modes if m not in self.sibling_modes]:
            raise ConfigError(
                f"verifier={self.name} is exact only for tree siblings drawn {' or '.join(self.sibling_modes)}, "
                f"but drafter={drafter.name} draws them {' and '.join(unknown)}; use verifier=rejection "
                "(exact for every mode in spec_zoo.draft.SIBLING_MODES) or another tree policy.")

    @abstractmethod
    def verify(
        self,
        draft: Draft,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> Verdict:
        """Judge ``draft``.

        target_logits: [len(draft) + 1, V]; row 0 is the target's logits after the last
        committed token (the distribution of first-level nodes), row i + 1 the logits
        after node i.
        """
