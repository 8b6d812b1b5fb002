"""Drafting with heads that run in sequence on the target's last hidden state
(`spec_zoo.draft_head.StagedHead`: the MLP speculator, the Hydra heads).

Like Medusa the drafter reads the target's state h that chose the last committed token
(``needs_target_hidden``) and runs no decoder layer; unlike Medusa, stage i also reads the
token drafted before it, so each node of a tree has its own state and its own distribution:

* chain (``tree: null``): stage 0 reads h and the last committed token, stage i the state of
  stage i - 1 and the token it drafted (its argmax, or a sample with q recorded when the run
  samples: q is exactly the distribution the token was drawn from given its parent);
* tree (``tree``: a policy of `spec_zoo.trees`): the policy's ``expand`` runs the next stage
  on every node of a level at once, each node with its parent's state and its own token, so
  siblings' subtrees differ (at most one level per stage). Greedy: top-k picks (q one-hot);
  sampled: draws without replacement from each node's own q; both exact under rejection.

The first step of a sequence drafts nothing (the target has not read the prompt yet). Apart
from a tree policy that learns (``auto``), nothing is kept between steps.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import torch

from spec_zoo.chain import ChainDrafter
from spec_zoo.costs import file_costs
from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_head import StagedHead, load_head
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import check_sample_mode, drafts_sampled, to_full_vocab
from spec_zoo.trees import Static, build_tree_policy


def level_length(drafter, levels: int, have: str, unit: str) -> DraftLength:
    """The draft length of a drafter with ``levels`` heads or stages, one drafted level each
    (Medusa, Hydra, MLP speculator): its static tree and ``num_draft`` checked against them
    before any drafting (`file_costs` then points it at the drafter's measured cost)."""
    if isinstance(drafter.tree, Static) and drafter.tree.depth > levels:
        raise ConfigError(f"drafter.tree has paths {drafter.tree.depth} deep but {have} {levels} {unit}s "
                          f"(one per level); use paths of at most {levels} ranks.")
    if int(drafter.num_draft or levels) > levels:
        raise ConfigError(f"drafter.num_draft={drafter.num_draft} but {have} {levels} {unit}s (one token each); "
                          f"use at most {levels}, or null for one per {unit}.")
    return DraftLength(int(drafter.num_draft or levels), drafter.adaptive, levels, drafter.token_cost,
                       drafter.learn_cost)


class LevelDrafter(ChainDrafter):
    """What the drafters with one drafted level per head or stage on the target's last hidden
    state share (Medusa, `spec_zoo.drafters.medusa.drafter`; `StagedDrafter`: Hydra, the MLP
    speculator): the settings' checks and one ``attach``: the heads loaded (`_load`), the draft
    length and a static tree checked against their levels (`level_length`), the method's own
    step (`_attached`), then the length and tree pointed at the drafter's measured cost
    (`file_costs`; after `_attached`, whose compiled parts change the key)."""

    needs_target_hidden = True
    unit: ClassVar[str] = "head"  # what gives one drafted level, in messages

    def _settings(self, heads, num_draft: int | None, adaptive: bool, sample: str | bool,
                  tree: str | dict | None, token_cost: float, learn_cost: bool) -> None:
        check_sample_mode(sample)
        if num_draft is not None and int(num_draft) < 1:
            raise ConfigError(f"drafter.num_draft={num_draft}; use a positive length or null (one per {self.unit}).")
        self.heads_source, self.sample_mode, self.tree = heads, sample, build_tree_policy(tree)
        self.num_draft, self.adaptive, self.token_cost, self.learn_cost = num_draft, adaptive, token_cost, learn_cost
        self.target: Target | None = None

    def _load(self, source, target: Target):
        """The heads from ``source`` (a dir, None for the shipped ones, or the module itself)."""
        raise NotImplementedError

    def _levels(self) -> tuple[int, str]:
        """(levels the heads draft, what has them, for messages: "the Medusa heads have")."""
        raise NotImplementedError

    def _attached(self, target: Target) -> None:
        """A method's own work once its heads are loaded and checked (none by default)."""

    def attach(self, target: Target) -> None:
        self.heads = self._load(self.heads_source, target)
        levels, have = self._levels()
        self.length = level_length(self, levels, have, self.unit)
        self._attached(target)
        file_costs(self)
        self.target = target

    batches = True  # forks (`ChainDrafter.for_sequence`) draft from their own sequence's hidden states

    def begin(self, state: DecodeState) -> None:
        self.length.reset()


class StagedDrafter(LevelDrafter):
    """heads:      a dir written by the method's training command, None (the artefact shipped for
                SmolLM2-135M, ``shipped``), or a `StagedHead`; trained for this target.
    num_draft:  chain: tokens per draft (None = one per stage); the starting length when adaptive.
    adaptive, token_cost, learn_cost: chain: choose each draft's length by expected speedup
                (`spec_zoo.draft_length`), up to one token per stage.
    sample:     "auto" samples from the heads when temperature > 0 (q recorded), argmax at 0.
    tree:       None = a chain; else a tree policy (`spec_zoo.trees`), at most one level per stage.

    A method sets ``head_class`` (its `StagedHead`), ``shipped`` and ``train_command``.
    """

    unit = "stage"
    heads: StagedHead
    head_class: ClassVar[type[StagedHead]]
    shipped: ClassVar[Path]
    train_command: ClassVar[str]

    def __init__(self, heads=None, num_draft: int | None = None, adaptive: bool = False,
                 sample: str | bool = "auto", tree: str | dict | None = None, token_cost: float = 0.05,
                 learn_cost: bool = True):
        if heads is None and not (self.shipped / self.head_class.RECORD).is_file():
            raise ConfigError(f"the shipped {self.head_class.WHAT} are missing ({self.shipped}); set drafter.heads=DIR "
                              f"to heads made with `{self.train_command}`.")
        self._settings(heads, num_draft, adaptive, sample, tree, token_cost, learn_cost)

    def _load(self, source, target: Target) -> StagedHead:
        if isinstance(source, StagedHead):
            return source
        return load_head(self.head_class, source or self.shipped, target.model, "drafter.heads", self.train_command)

    def _levels(self) -> tuple[int, str]:
        return self.heads.num_stages, f"the {self.head_class.WHAT} have"

    def _stage(self, stage: int, before: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(states, full-vocabulary logits) of ``stage`` on states ``before`` and ``tokens``."""
        assert self.target is not None
        heads = self.heads
        after = heads.advance(stage, before, torch.tensor(tokens, dtype=torch.long))
        return after, to_full_vocab(heads.logits(stage, after), heads.vocab_ids, self.target.vocab_size)

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        if self.target is None:
            raise RuntimeError(f"{type(self).__name__}.attach(target) must be called before drafting")
        if state.target_hidden is None:  # the target has not read the prompt yet
            return Draft.empty()
        heads = self.heads
        start = heads.start(state.target_hidden[-1:].to(heads.head.dtype))
        if self.tree is not None:
            states: dict[int, torch.Tensor] = {}  # node -> its stage's state (ROOT: stage 0's)

            def expand(tree: Draft, nodes: list[int]) -> torch.Tensor:
                by_stage: dict[int, list[int]] = {}  # a level's nodes share a stage: one batched call
                for i, n in enumerate(nodes):
                    by_stage.setdefault(0 if n == ROOT else tree.depths[n] + 1, []).append(i)
                rows: list[torch.Tensor] = [torch.empty(0)] * len(nodes)
                for stage, idx in by_stage.items():  # each node reads its parent's state and its own token
                    before = torch.cat([start if nodes[i] == ROOT else states[tree.parents[nodes[i]]] for i in idx])
                    tokens = [state.tokens[-1] if nodes[i] == ROOT else int(tree.tokens[nodes[i]]) for i in idx]
                    after, logits = self._stage(stage, before, tokens)
                    for j, i in enumerate(idx):
                        states[nodes[i]], rows[i] = after[j : j + 1], logits[j]
                return torch.stack(rows)

            capped = replace(state, max_depth=min(state.max_depth, heads.num_stages))
            return self.tree.build(expand, capped, drafts_sampled(self.sample_mode, state.sampling))
        k = min(self.length.choose(state=state), state.max_depth)
        if k == 0:
            return Draft.empty()
        current, logits = self._stage(0, start, [state.tokens[-1]])
        stage = 0

        def advance(token: int, more: bool) -> torch.Tensor:
            nonlocal current, stage
            stage += 1
            current, after = self._stage(stage, current, [token])
            return after[0]

        return self.draft_chain(state, logits[0], k, advance)
