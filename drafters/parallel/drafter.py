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
from spec_zoo.sampling import drafts_sampled
from spec_zoo.target import Target

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-parallel"


class ParallelDrafter(DistilledDrafter):
    """path:      a parallel-draft dir (`spec-zoo-train parallel`); None = the one shipped for SmolLM2-135M.
    num_draft: chain: tokens per draft (None = k, the most one forward gives); the starting length when adaptive.
    adaptive, token_cost: chain: choose each draft's length by expected speedup (`spec_zoo.draft_length`), up to k.
    sample:    "auto" samples each row when temperature > 0 (q recorded), argmax at 0.
    tree:      None = a chain; else a tree policy (`spec_zoo.trees`), at most k levels.
    dtype, device, runtime: the draft model's, as for the distilled draft."""

    name = "parallel"
    drafts_together = False  # one forward drafts the whole chain: no per-token calls to share

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

    def rows(self, tokens: list[int], depth: int) -> torch.Tensor:
        """The draft's distributions (target-vocabulary logits) of the next ``depth`` tokens after
        ``tokens``: one forward of the tokens it has not read and ``depth`` - 1 masks."""
        draft = Draft.chain(self.mask_ids[: depth - 1])
        return self.to_target_vocab(self.runner.score(tokens, draft).logits)

    @torch.no_grad()
    def _draft(self, state: DecodeState) -> Draft:
        if not self.mask_ids:
            raise RuntimeError("ParallelDrafter.attach(target) must be called before drafting")
        if self.tree is not None:
            depth = min(self.k, state.max_depth)
            if depth < 1:
                return Draft.empty()
            rows = self.rows(state.tokens, depth)

            def expand(tree: Draft, nodes: list[int]) -> torch.Tensor:  # row d: the children at depth d
                return rows[[0 if n == ROOT else tree.depths[n] + 1 for n in nodes]]

            return self.tree.build(expand, replace(state, max_depth=depth),
                                   drafts_sampled(self.sample_mode, state.sampling))
        depth = min(self.length.choose(state=state), state.max_depth)
        if depth < 1:
            return Draft.empty()
        rows = self.rows(state.tokens, depth)
        later = iter(rows[1:])
        return self.draft_chain(state, rows[0], depth, lambda token, more: next(later))
