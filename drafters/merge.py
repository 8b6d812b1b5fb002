"""``drafter=merge``: the union of several drafters' proposals, scored as one tree.

Every member drafts every step; their chains (or trees) become one tree, so the target
checks all the guesses in one forward and the verifier keeps the longest that holds.
E.g. ``drafter.members=[ngram,eagle]``: the lookup's copy and the head's guess side by side.

How q is defined, so exact sampling stays exact (`spec_zoo.verifiers.rejection` tries a
node's children in order against the residual of p, and needs each child drawn
independently from its own q row, or deterministic):

- **Deterministic members** (``probs=None``: ngram, greedy drafting) are merged into a
  trie: drafts sharing a prefix share its nodes, and a token proposed twice at the same
  place is one node. q is one-hot per node. Exact: a deterministic duplicate of a sibling
  already tried would always be rejected (the residual has no mass on it) and leave the
  residual unchanged, so dropping it changes nothing; the children of a shared node are
  deterministic given its context.
- **Sampled members** (``probs`` rows: drafting from q at temperature > 0) are *not*
  merged: each member's draft is attached under the root as its own subtree, keeping its
  q rows, even where its tokens repeat another member's. Merging a sampled token into an
  equal sibling would drop an independent draw from its q, and the recursive rejection
  would no longer reproduce p. Siblings from different members have different q rows;
  the verifier's rule is exact for each sibling drawn from its own q independently of
  the others (the residual after each rejection is the target of the next try).
- A tree mixing both stores one-hot rows for the deterministic nodes.
- A member's repeated i.i.d. draws (``Draft.draws``, multi-draft trees) keep their order.
  Siblings drawn *without replacement* get, each, the row it was really drawn from (q
  without its earlier siblings' tokens), so the merged tree is verified as "iid" rows and
  the removal never reaches another member's siblings.

Certified by enumeration (tests/test_sampling_exact.py) for sampled, greedy and
mixed member sets.
"""

from __future__ import annotations

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.drafters.composed import ComposedDrafter
from spec_zoo.interfaces import DecodeState
from spec_zoo.lockstep import Steps


def merge_drafts(drafts: list[Draft]) -> Draft:
    """One tree holding every draft (see the module docstring for q)."""
    nodes: dict[tuple[int, int], int] = {}  # (parent, token) -> node of the deterministic trie
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[torch.Tensor | int] = []  # a q row, or the token of a one-hot row
    draws: dict[int, list[int]] = {}  # per merged parent, every member's draws in order
    for draft in drafts:
        draft = drawn_rows(draft)
        probs = draft.probs
        merge = probs is None
        index: list[int] = []  # this draft's node -> merged node
        for i, (token, parent) in enumerate(zip(draft.tokens.tolist(), draft.parents)):
            parent = ROOT if parent == ROOT else index[parent]
            if merge and (parent, token) in nodes:
                index.append(nodes[(parent, token)])
                continue
            index.append(len(tokens))
            if merge:
                nodes[(parent, token)] = len(tokens)
            tokens.append(token)
            parents.append(parent)
            rows.append(token if probs is None else probs[i])
        for parent in [ROOT, *range(len(draft))]:
            order = [index[c] for c in draft.draws_of(parent)]
            if order:
                draws.setdefault(ROOT if parent == ROOT else index[parent], []).extend(order)
    sampled = [r for r in rows if isinstance(r, torch.Tensor)]
    if not sampled:
        return Draft(torch.tensor(tokens, dtype=torch.long), parents)
    like = sampled[0]
    probs = torch.stack([r if isinstance(r, torch.Tensor) else _one_hot(r, like) for r in rows])
    repeats = any(draft.draws for draft in drafts)  # else the children in order say it all
    return Draft(torch.tensor(tokens, dtype=torch.long), parents, probs, draws=draws if repeats else None)


def drawn_rows(draft: Draft) -> Draft:
    """A draft whose siblings were drawn without replacement, as per-node rows of what each
    sibling was drawn from (q renormalised without the earlier siblings' tokens)."""
    if draft.siblings != "without_replacement":
        return draft
    assert draft.probs is not None  # a Draft with sampled siblings carries their rows
    probs, tokens = draft.probs.clone(), draft.tokens.tolist()
    for parent in [ROOT, *range(len(draft))]:
        kids = draft.children(parent)
        for k, child in enumerate(kids[1:], 1):
            probs[child, [tokens[c] for c in kids[:k]]] = 0.0
            probs[child] /= probs[child].sum()
    return Draft(draft.tokens, draft.parents, probs, "iid")


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


class MergeDrafter(ComposedDrafter):
    """members: drafter option names (``[ngram, eagle]``), dicts with ``_target_``, or `Drafter`s;
    params:  per-member overrides, keyed by member name (``{ngram: {num_draft: 8}}``; a name
             listed twice is keyed ``name_<position>`` the second time).

    A step costs every member's draft; the tree is scored with tree attention. When only
    one member proposes, its draft is used as is (an early-exit chain then still resumes
    at its exit layer in the target; a merged tree makes the target run all its layers).
    """

    name = "merge"
    drafts_trees = True  # two members proposing make a tree

    def drafting(self, state: DecodeState) -> Steps[Draft]:
        self._collect(state)
        proposing = []
        for i in range(len(self.members)):
            draft = yield from self._asking(i, state)
            proposing += [draft] if len(draft) else []
        if len(proposing) <= 1:  # as is: a lone early-exit chain still resumes at its exit layer
            return proposing[0] if proposing else Draft.empty()
        return merge_drafts(proposing)
