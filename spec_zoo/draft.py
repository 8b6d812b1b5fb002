"""The `Draft`: what a drafter proposes and a verifier judges (a chain is a tree).

Nodes are stored in topological order (a parent always precedes its children), so
one pass over the nodes computes depths, and the accepted path is a list of node
indices from a child of the last committed token down to the deepest accepted node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ROOT = -1  # parent index of a node that follows the last committed token directly
#: the most nodes a draft tree may have: it is scored in one target forward (an attention mask of
#: nodes x (context + nodes)) and keeps a q row per node (8192 x a 49k vocabulary in float32: 1.6 GB), so a
#: bigger one is refused before any work rather than run the machine out of memory
MAX_NODES = 8192

#: how a node's siblings were drawn from their shared q; exact verification needs to know
#: (`spec_zoo.verifiers.rejection`): independent draws, draws without replacement (each
#: from q with the earlier siblings' tokens removed), or no draw at all (q one-hot)
SIBLING_MODES = ("iid", "without_replacement", "deterministic")


@dataclass
class Draft:
    """Proposed tokens after the committed sequence.

    tokens:  LongTensor [n], in topological order.
    parents: list of n ints; ``ROOT`` (-1) for children of the last committed token.
             A chain has parents ``[-1, 0, 1, ...]``.
    probs:   FloatTensor [n, V] or None. Row i is the draft distribution q that node i
             was drawn from: the distribution at its parent's context, so siblings
             share one row. None marks a deterministic drafter (q is one-hot).
    siblings: how siblings were drawn (`SIBLING_MODES`); None means "deterministic"
             without ``probs``, "iid" with them (a chain's lone children fit either).
    draws:   for "iid" trees that merge equal draws into one node (multi-draft): per parent,
             its children in the order they were drawn, a child listed again for every
             further draw of its token. The exact rule replays each draw, since a repeated
             rejected draw still shrinks the residual. None: each child drawn once, in order.
    """

    tokens: torch.Tensor
    parents: list[int]
    probs: torch.Tensor | None = None
    siblings: str | None = None
    draws: dict[int, list[int]] | None = None
    depths: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.parents = [int(p) for p in self.parents]
        n = len(self.parents)
        if self.tokens.numel() != n:
            raise ValueError(f"Draft has {self.tokens.numel()} tokens but {n} parents")
        if self.probs is not None and self.probs.shape[0] != n:
            raise ValueError(f"Draft.probs has {self.probs.shape[0]} rows, expected one per node ({n})")
        self.depths = []
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(f"Draft node {i} has parent {p}: parents must be -1 or an earlier node")
            self.depths.append(0 if p == ROOT else self.depths[p] + 1)
        if self.siblings is None:
            self.siblings = "deterministic" if self.probs is None else "iid"
        if self.siblings not in SIBLING_MODES:
            raise ValueError(f"Draft.siblings={self.siblings!r}; one of {', '.join(SIBLING_MODES)}")
        if (self.probs is None) != (self.siblings == "deterministic"):
            raise ValueError(f"Draft.siblings={self.siblings!r} needs probs "
                             f"{'None' if self.siblings == 'deterministic' else 'rows'} "
                             "(q is one-hot only without them)")
        if self.draws is not None:
            if self.siblings != "iid":
                raise ValueError("Draft.draws replays repeated i.i.d. draws; it needs siblings='iid'")
            for parent, order in self.draws.items():
                if sorted(set(order)) != self.children(parent):
                    raise ValueError(f"Draft.draws[{parent}]={order} must list exactly the children of "
                                     f"{parent} ({self.children(parent)}), repeats allowed")

    # -- constructors -------------------------------------------------------------
    @classmethod
    def empty(cls) -> Draft:
        """No proposal: the step is plain autoregressive decoding."""
        return cls(torch.empty(0, dtype=torch.long), [])

    @classmethod
    def chain(cls, tokens, probs: torch.Tensor | None = None) -> Draft:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        return cls(tokens, list(range(-1, tokens.numel() - 1)), probs)

    # -- derived structure ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path length (0 for an empty draft)."""
        return max(self.depths, default=-1) + 1

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def children(self, node: int) -> list[int]:
        """Indices of the children of ``node`` (``ROOT`` for the first level), in order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def draws_of(self, node: int) -> list[int]:
        """The children of ``node`` in the order they were drawn, repeats included (`draws`)."""
        if self.draws is not None and node in self.draws:
            return self.draws[node]
        return self.children(node)

    def ancestors_mask(self) -> torch.Tensor:
        """Bool [n, n]: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p != ROOT:
                mask[i] |= mask[p]
        return mask

    def path_to(self, node: int) -> list[int]:
        """Node indices from the first level down to ``node``."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = set(self.parents)
        return [i for i in range(len(self)) if i not in has_child]

    def truncated(self, max_depth: int) -> Draft:
        """The sub-draft of nodes shallower than ``max_depth`` (a budget cut)."""
        if self.depth <= max_depth:
            return self
        keep = [i for i, d in enumerate(self.depths) if d < max_depth]
        remap = {old: new for new, old in enumerate(keep)}
        parents = [ROOT if self.parents[i] == ROOT else remap[self.parents[i]] for i in keep]
        probs = None if self.probs is None else self.probs[keep]
        draws = None if self.draws is None else {
            remap.get(parent, ROOT): [remap[c] for c in order]
            for parent, order in self.draws.items() if order[0] in remap}
        return Draft(self.tokens[keep], parents, probs, self.siblings, draws)
