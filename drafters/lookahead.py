"""Lookahead decoding (Fu et al. 2024, arXiv 2402.02057): Jacobi iterations run inside the
target's own forward produce n-grams; n-grams that start with the last committed token
are verified in the same forward. No draft model.

The paper's one forward holds two branches under a custom attention mask; both are token
trees in spec-zoo's Draft IR, so the target scores them as one tree:

- the *lookahead branch*, a window of ``window`` (W) columns and up to ``ngram - 1``
  levels of past Jacobi guesses: level 0 is a chain under the root (the oldest guesses,
  one per position), and the guess of level l in column c is a child of the guess of
  level l - 1 in column c, so it sits at depth c + l and sees exactly what the paper's
  mask shows it (the level-0 prefix, then one guess per newer level in its column);
- the *verification branch*: up to ``guesses`` (G) pool n-grams whose first token is the
  last committed token, each a chain of ``ngram - 1`` tokens under the root.

After the verifier has judged the tree, the target's argmax after the newest guess of each
column (read from ``state.draft_logits``, the one decoder hook this needs) is the next
Jacobi guess there; with the window full, each column's guesses plus it form an n-gram for
the pool, and the levels shift by one (the oldest dropped), as in the paper. Every node is
a candidate for the verifier, lookahead nodes included (the paper verifies only the pool
n-grams; accepting a correct Jacobi guess too is exact and never worse). Deterministic
(``probs=None``), equal siblings merged: lossless with every exact verifier.
"""

from __future__ import annotations

import copy
import random

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.stats import StepStats


class LookaheadDrafter(Drafter):
    """Jacobi lookahead with an n-gram pool.

    ``window`` (W): future positions guessed in parallel; ``ngram`` (N): n-gram size (the
    window keeps N - 1 levels); ``guesses`` (G): pool n-grams verified per step, and kept
    per first token (least recently produced dropped first). A step scores at most
    W (N - 1) + G (N - 1) nodes. ``pool_from_prompt``: also fill the pool with the
    prompt's and the output's own n-grams (the reference code's POOL_FROM_PROMPT).
    ``seed``: the first guesses are prompt tokens drawn with it (never from the run's
    generator, so sampling draws are untouched).
    """

    name = "lookahead"
    drafts_trees = True
    needs_draft_logits = True

    def __init__(self, window: int = 5, ngram: int = 3, guesses: int = 5, pool_from_prompt: bool = False,
                 seed: int = 0):
        if window < 1 or ngram < 2 or guesses < 0:
            raise ConfigError(f"drafter.window={window}, drafter.ngram={ngram}, drafter.guesses={guesses}: "
                              "need window >= 1, ngram >= 2 and guesses >= 0.")
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self.pool_from_prompt, self.seed = pool_from_prompt, seed

    batches = True

    def for_sequence(self, slot: int) -> LookaheadDrafter:
        """Its own window, pool and guesses (all made by `begin`); the settings are shared."""
        return copy.copy(self)

    def begin(self, state: DecodeState) -> None:
        pick = random.Random(self.seed)
        prompt = state.tokens[: state.prompt_len]
        self.levels: list[list[int]] = [[pick.choice(prompt) for _ in range(self.window)]]
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self._pooled = 0  # committed tokens whose n-grams are in the pool (pool_from_prompt)
        self._scored: tuple[int, list[list[int]]] | None = None  # (draft size, node of each window guess)

    # -- the n-gram pool ------------------------------------------------------------------
    def _remember(self, gram: list[int]) -> None:
        kept = self.pool.setdefault(gram[0], [])
        rest = tuple(gram[1:])
        if rest in kept:
            kept.remove(rest)
        kept.append(rest)
        if len(kept) > max(self.guesses, 1):
            kept.pop(0)

    def _pool_committed(self, tokens: list[int]) -> None:
        for start in range(max(self._pooled - self.ngram + 1, 0), len(tokens) - self.ngram + 1):
            self._remember(tokens[start: start + self.ngram])
        self._pooled = len(tokens)

    # -- the Jacobi step ------------------------------------------------------------------
    def _jacobi(self, logits: torch.Tensor | None) -> None:
        """Next guesses from the target's argmax after each column's newest guess; with the
        window full, each column's n-gram goes to the pool and the levels shift."""
        if self._scored is None or logits is None or logits.shape[0] != self._scored[0] + 1:
            return  # the last step scored no lookahead branch (or not this drafter's draft)
        nodes = self._scored[1]
        following = logits[[node + 1 for node in nodes[-1]]].argmax(-1).tolist()
        if len(self.levels) == self.ngram - 1:
            for column, token in enumerate(following):
                self._remember([level[column] for level in self.levels] + [token])
            self.levels = self.levels[1:] + [following]
        else:
            self.levels.append(following)

    def propose(self, state: DecodeState) -> Draft:
        self._jacobi(state.draft_logits)
        self._scored = None
        tokens = state.tokens
        if self.pool_from_prompt:
            self._pool_committed(tokens)
        tree_tokens: list[int] = []
        parents: list[int] = []
        node_of: dict[tuple[int, int], int] = {}

        def add(parent: int, token: int) -> int:
            if (parent, token) not in node_of:
                node_of[(parent, token)] = len(tree_tokens)
                tree_tokens.append(token)
                parents.append(parent)
            return node_of[(parent, token)]

        # verification branch: pool n-grams after the last committed token, newest first
        for gram in reversed(self.pool.get(tokens[-1], [])[-self.guesses:] if self.guesses else []):
            parent = ROOT
            for token in gram[: state.max_depth]:
                parent = add(parent, token)
        # lookahead branch, when its deepest guess (column W - 1, newest level) fits the budget
        if self.window - 1 + len(self.levels) - 1 < state.max_depth:
            spine, parent = [], ROOT
            for token in self.levels[0]:
                parent = add(parent, token)
                spine.append(parent)
            guesses = [spine]
            for level in self.levels[1:]:
                guesses.append([add(below, token) for below, token in zip(guesses[-1], level)])
            self._scored = (len(tree_tokens), guesses)
        return Draft(torch.tensor(tree_tokens, dtype=torch.long), parents) if tree_tokens else Draft.empty()

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        if self._scored is not None and len(draft) != self._scored[0]:
            self._scored = None  # the loop cut the draft: its rows no longer match the guesses
