"""``drafter=parallel``: a parallel draft (PARD) drafts k tokens in one forward.

The draft model is the distilled draft trained with mask tokens (`spec_zoo.drafters.parallel.model`,
`spec-zoo-train parallel`). Each step it scores the committed tokens it has not read yet, then
k - 1 mask tokens, in ONE forward through its `Target` wrapper: row 0 (the last committed
token) is the distribution of draft token 1, mask i's row that of token i + 1. The masks' KV
is dropped at the next step (the wrapper's cache follows the committed tokens, which never hold
a mask id), so the cache keeps the real tokens only.

* chain (``tree: null``): token i is row i's argmax, or a sample from it when the run samples
  (q recorded: a row does not read the tokens drafted before its own, so it is exactly the q the
  token was drawn from, as for Medusa heads, and rejection stays exact);
* tree (``tree``: a policy of `spec_zoo.trees`): row d gives the children of every node of
  depth d - 1 (the same ranked tokens under every parent, Medusa's tree), at most k levels.

Otherwise a distilled draft (`DistilledDrafter`: the target's embeddings plugged in, the reduced
draft vocabulary mapped back, the target checked).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.drafters.distilled.drafter import SHIPPED as SHIPPED_DISTILLED
from spec_zoo.drafters.distilled.drafter import DistilledDrafter
from spec_zoo.drafters.parallel.model import MASKS, MaskedEmbedding, apply_updates, base_dir, read_parallel
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.lockstep import Steps, answer, drive
from spec_zoo.runtime.target import NextLogits, Target
from spec_zoo.sampling import drafts_sampled

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-parallel"


class ParallelDrafter(DistilledDrafter):
    """path:      a parallel-draft dir (`spec-zoo-train parallel`); None = the one shipped for SmolLM2-135M.
    num_draft: chain: tokens per draft (None = k, the most one forward gives); the starting length when adaptive.
    adaptive, token_cost: chain: choose each draft's length by expected speedup (`spec_zoo.draft_length`), up to k.
    sample:    "auto" samples each row when temperature > 0 (q recorded), argmax at 0.
    tree:      None = a chain; else a tree policy (`spec_zoo.trees`), at most k levels.
    dtype, device, runtime: the draft model's, as for the distilled draft."""

    name = "parallel"

    def __init__(self, path=None, num_draft: int | None = None, adaptive: bool = False, token_cost: float = 0.05,
                 sample: str | bool = "auto", tree: str | dict | None = None, dtype: str = "float32",
                 device: str = "cpu", runtime: str = "eager"):
        if path is None and not (SHIPPED / "parallel.json").is_file():
            raise ConfigError(f"the shipped parallel draft is missing ({SHIPPED}); reinstall spec-zoo, or set "
                              "drafter.path=DIR to a draft made with `spec-zoo-train parallel`.")
        where = Path(path).expanduser() if path else SHIPPED
        record, tensors = read_parallel(where)
        self.k = int(record["k"])
        if num_draft is not None and not 1 <= int(num_draft) <= self.k:
            raise ConfigError(f"drafter.num_draft={num_draft} but {where} drafts k={self.k} tokens per forward; "
                              f"use 1..{self.k}, or null for k.")
        super().__init__(base_dir(record, SHIPPED_DISTILLED, where), dtype=dtype, device=device,
                         num_draft=int(num_draft or self.k), adaptive=adaptive, max_draft=self.k,
                         token_cost=token_cost, sample=sample, tree=tree, runtime=runtime)
        apply_updates(self.runner.model, tensors, "drafter.path", where)
        self.masks = tensors[MASKS].to(self.runner.device, self.runner.dtype)
        self.parallel_record, self.source = record, str(where)
        self.mask_ids: list[int] = []

    def attach(self, target: Target) -> None:
        if self._attached_to is target:
            return
        super().attach(target)
        body = self.runner.model.model
        embed = body.embed_tokens.base if isinstance(body.embed_tokens, MaskedEmbedding) else body.embed_tokens
        if embed.embedding_dim != self.masks.shape[1]:
            raise ConfigError(f"drafter.path={self.source}: its mask embeddings have width {self.masks.shape[1]}, "
                              f"the draft's embeddings {embed.embedding_dim}; retrain it for this draft.")
        body.embed_tokens = MaskedEmbedding(embed, self.masks)
        self.mask_ids = [body.embed_tokens.first + i for i in range(self.k - 1)]

    # a compiled draft model drafts a batch together: every sequence's one forward (its unread
    # tokens and masks) is one call of its graph, each sequence's rows what it gets alone
    @property  # computes the attribute Drafter declares
    def drafts_together(self) -> bool:
        return self.runner.runtime == "compiled"

    def _depth(self, state: DecodeState) -> int:
        """How many tokens this step drafts (0: none): the tree's levels, or the chain's length."""
        if not self.mask_ids:
            raise RuntimeError("ParallelDrafter.attach(target) must be called before drafting")
        return min(self.k if self.tree is not None else self.length.choose(state=state), state.max_depth)

    def _ask(self, state: DecodeState, depth: int) -> NextLogits:
        """The one forward a draft of ``depth`` tokens needs: the tokens the draft has not read,
        then ``depth`` - 1 masks (row 0: token 1's distribution, mask i's row: token i + 1's)."""
        return NextLogits(self.runner, self._held, list(state.tokens), Draft.chain(self.mask_ids[: depth - 1]))

    @torch.no_grad()
    def _draft(self, state: DecodeState) -> Draft:
        return drive(self._steps(state), answer)

    def drafting(self, state: DecodeState) -> Steps[Draft]:
        """`propose` as steps (`spec_zoo.lockstep`): the forward is asked, so a batch's sequences
        draft in one call of the compiled draft model."""
        if not self.drafts_together:
            return (yield from super().drafting(state))
        return (yield from self._steps(state))

    def _steps(self, state: DecodeState) -> Steps[Draft]:
        depth = self._depth(state)
        if depth < 1:
            return Draft.empty()
        return self._from_rows(state, (yield self._ask(state, depth)), depth)

    def _from_rows(self, state: DecodeState, logits: torch.Tensor, depth: int) -> Draft:
        """The chain, or the tree, drafted from the forward's rows."""
        rows = self.to_target_vocab(logits)
        if self.tree is not None:
            def expand(tree: Draft, nodes: list[int]) -> torch.Tensor:  # row d: the children at depth d
                return rows[[0 if n == ROOT else tree.depths[n] + 1 for n in nodes]]

            return self.tree.build(expand, replace(state, max_depth=depth),
                                   drafts_sampled(self.sample_mode, state.sampling))
        later = iter(rows[1:])
        return self.draft_chain(state, rows[0], depth, lambda token, more: next(later))
