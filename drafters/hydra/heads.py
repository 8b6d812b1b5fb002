"""Hydra heads (Ankner et al. 2024, arXiv 2402.05109): Medusa heads made sequentially
dependent, and their artefact format.

Head i (0-based) reads the target's state h that chose the last committed token *and* the
embeddings of the tokens before the one it guesses: the last committed token and the tokens
heads 0..i-1 drafted (Hydra's "grounded" heads)::

    logits_i = head(h + SiLU(W_i [h; emb(x_0); ...; emb(x_i)] + b_i))

one residual block per head over the concatenation (Hydra's MLP head, its residual taken
from h alone: Hydra's code adds a learnt (i + 2) H x H projection there), then the target's
LM-head rows of the draft vocabulary (`spec_zoo.draft_head.VocabHead`: shared and frozen
unless ``train_head``). ``W_i`` starts at zero, so an untrained Hydra head is an untrained
Medusa head (it repeats the target's next-token guess) and training adds what the drafted
tokens say. The token embeddings are the target's (`spec_zoo.draft_head.StagedHead.embed`).
As a `StagedHead` the state after head i is the concatenation so far.
"""

from __future__ import annotations

import torch

from spec_zoo.draft_head import StagedHead, load_head
from spec_zoo.errors import ConfigError


class HydraHeads(StagedHead):
    """States [N, H] -> K heads; head i's state is [h; emb(x_0); ...; emb(x_i)], [N, (i + 2) H]."""

    FORMAT, RECORD, WEIGHTS, WHAT = "spec-zoo-hydra-heads", "hydra.json", "hydra.safetensors", "Hydra heads"

    def __init__(self, target_model, num_heads: int, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        if int(num_heads) < 1:
            raise ConfigError(f"heads.num_heads={num_heads}; Hydra needs at least one head (e.g. 4).")
        super().__init__(target_model, num_heads, vocab_ids, train_head)
        hidden, dtype = self.head.shape[1], self.head.dtype
        self.blocks = torch.nn.ModuleList(torch.nn.Linear((i + 2) * hidden, hidden, dtype=dtype)
                                          for i in range(self.num_stages))
        for block in self.blocks:
            assert isinstance(block, torch.nn.Linear)
            torch.nn.init.zeros_(block.weight)
            torch.nn.init.zeros_(block.bias)

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([state, self.embed(tokens)], dim=-1)

    def logits(self, stage: int, state: torch.Tensor) -> torch.Tensor:
        h = state[..., : self.head.shape[1]]
        return torch.nn.functional.linear(h + torch.nn.functional.silu(self.blocks[stage](state)), self.head)

    def describe(self) -> dict:
        return {"num_heads": self.num_stages, **super().describe()}

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids):
        return cls(target_model, int(record["num_heads"]), vocab_ids, bool(record["train_head"]))


def load_hydra(path, target_model) -> HydraHeads:
    """The Hydra heads at ``path``, checked against ``target_model``."""
    return load_head(HydraHeads, path, target_model, "drafter.heads", "spec-zoo-train hydra")
