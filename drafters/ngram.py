"""Prompt lookup decoding (Saxena 2023): draft by copying what followed the last
occurrence of the current suffix in the prompt + generated text.

Free to run (no model), and strong wherever the output repeats its input:
summarisation, extraction, code editing, RAG.
"""

from __future__ import annotations

import copy

import torch

from spec_zoo.costs import file_costs
from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.stats import StepStats


class NgramDrafter(Drafter):
    """Longest-suffix match over an incremental n-gram index.

    For n from ``max_ngram`` down to ``min_ngram``: if the last n committed tokens
    occurred before, propose the (up to) ``num_draft`` tokens that followed their most
    recent earlier occurrence. With ``adaptive`` the length is chosen per step by expected
    speedup (see `spec_zoo.draft_length`), so poor matches stop costing target time.
    ``token_cost`` is the cost of scoring one extra token, in target forwards (measured
    online when ``learn_cost``). The index maps each n-gram to the position after its
    latest occurrence and is extended only with newly committed tokens, so a lookup
    costs O(max_ngram) however long the context grows. Deterministic (``probs=None``).

    With ``branches`` > 1 the draft is a tree: the continuations of the latest occurrences
    that differ in their first token, each a chain under the root, within ``max_nodes``
    nodes in all (the first gets the chosen length first). ``order`` ranks them: "recent"
    (the most recent occurrence first) or "frequent" (the next token seen most often after
    the n-gram first, recency breaking ties; with one branch, the chain follows it). The
    index keeps, per n-gram and distinct next token, its latest position and count, so
    branching costs no extra search. Siblings are distinct and deterministic: exact under
    greedy and rejection verification (a rejected sibling just loses its mass in p).
    """

    name = "ngram"

    def __init__(
        self,
        num_draft: int = 4,
        min_ngram: int = 1,
        max_ngram: int = 3,
        adaptive: bool = True,
        max_draft: int = 16,
        token_cost: float = 0.1,
        learn_cost: bool = True,
        branches: int = 1,
        max_nodes: int = 16,
        order: str = "recent",
    ):
        if branches < 1 or max_nodes < 1:
            raise ConfigError(f"drafter.branches={branches}, drafter.max_nodes={max_nodes}: both must be >= 1 "
                              "(branches=1 drafts one chain).")
        if order not in ("recent", "frequent"):
            raise ConfigError(f"drafter.order={order!r}; allowed values: recent, frequent.")
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ConfigError(
                f"drafter.min_ngram={min_ngram}, drafter.max_ngram={max_ngram}: need 1 <= min_ngram <= max_ngram."
            )
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        # adaptive: one acceptance estimate per match length (longer matches copy more reliably)
        self.length = DraftLength(num_draft, adaptive, max_draft, token_cost, learn_cost)
        file_costs(self)
        self._matched = 0  # n-gram length behind the last proposal
        self.branches, self.max_nodes, self.order = branches, max_nodes, order
        # n-gram -> {next token: (position after its latest occurrence, occurrences)}, least recent first
        self._index: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    @property  # computes the attribute Drafter declares (ComposedDrafter sets it per instance)
    def drafts_trees(self) -> bool:  # type: ignore[override]
        return self.branches > 1

    batches = True

    def for_sequence(self, slot: int) -> Drafter:
        """Its own index, match state and draft-length estimates; the settings are shared."""
        twin = copy.copy(self)
        twin.length = copy.deepcopy(self.length)
        twin._index, twin._indexed, twin._matched = {}, 0, 0
        return twin

    def begin(self, state: DecodeState) -> None:
        self._index.clear()
        self._indexed = 0
        self.length.reset()

    def _extend_index(self, tokens: list[int]) -> None:
        # index n-grams ending at positions < len - 1, so the current suffix never matches itself
        for end in range(self._indexed, len(tokens) - 1):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                after = self._index.setdefault(tuple(tokens[end - n + 1 : end + 1]), {})
                _, seen = after.pop(tokens[end + 1], (0, 0))  # re-inserted: the most recent comes last
                after[tokens[end + 1]] = (end + 1, seen + 1)
        self._indexed = max(self._indexed, len(tokens) - 1)

    def propose(self, state: DecodeState) -> Draft:
        tokens = state.tokens
        self._extend_index(tokens)
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            after = self._index.get(tuple(tokens[-n:]))
            if after:
                self._matched = n
                k = min(self.length.choose(n, state), state.max_depth, self.max_nodes)
                found = list(after.values())[::-1]  # most recent first
                if self.order == "frequent":
                    found.sort(key=lambda entry: -entry[1])  # stable: recency breaks ties
                return self._tree([tokens[start : start + k] for start, _ in found[: self.branches]])
        return Draft.empty()

    def _tree(self, chains: list[list[int]]) -> Draft:
        """The chains (distinct first tokens) side by side under the root, within ``max_nodes``."""
        tokens: list[int] = []
        parents: list[int] = []
        left = self.max_nodes
        for chain in chains:
            chain = chain[:left]
            parents += [-1] + list(range(len(tokens), len(tokens) + len(chain) - 1)) if chain else []
            tokens += chain
            left -= len(chain)
        return Draft(torch.tensor(tokens, dtype=torch.long), parents)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        # the length rule models the chain of the most recent match: the tree's depth
        self.length.update(draft.depth, len(verdict.path), self._matched, step.draft_s + step.verify_s)
