"""Medusa heads (Cai et al. 2024, Medusa-1): K small heads on the target's last hidden state.

The target's LM head reads its last-layer state h_j to predict token j + 1; Medusa head i
(1..K) reads the same h_j to guess token j + 1 + i, i.e. i tokens further ahead, without
seeing the tokens in between. Each head is one residual block, ``h + SiLU(W h + b)``, then
an LM head over the draft vocabulary (`spec_zoo.draft_head.VocabHead`: the target's rows,
shared and frozen, unless ``train_head``). ``W`` starts at zero, so an untrained head i
starts as the target's own next-token guess (Medusa's initialisation) and training moves
it i tokens ahead. The heads never run a decoder layer and keep no cache: drafting K
tokens costs K small matrix products on a state verification has already computed.
"""

from __future__ import annotations

import torch

from spec_zoo.draft_head import VocabHead, load_head
from spec_zoo.errors import ConfigError


class ResBlock(torch.nn.Module):
    """``x + SiLU(linear(x))``, the linear initialised at zero (an identity at the start)."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden, dtype=dtype)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.silu(self.linear(x))


class MedusaHeads(VocabHead):
    """States [..., H] -> logits [..., K, V_draft] of the K heads (head i guesses i + 1 ahead
    of the state's own next token)."""

    FORMAT, RECORD, WEIGHTS, WHAT = "spec-zoo-medusa-heads", "medusa.json", "medusa.safetensors", "Medusa heads"

    def __init__(self, target_model, num_heads: int, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        super().__init__(target_model, vocab_ids, train_head)
        if int(num_heads) < 1:
            raise ConfigError(f"heads.num_heads={num_heads}; Medusa needs at least one head (e.g. 4).")
        self.num_heads = int(num_heads)
        hidden, dtype = self.head.shape[1], self.head.dtype
        self.blocks = torch.nn.ModuleList(ResBlock(hidden, dtype) for _ in range(self.num_heads))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """Logits [..., K, V_draft] of every head for states [..., H]."""
        out = torch.stack([block(states) for block in self.blocks], dim=-2)
        return torch.nn.functional.linear(out, self.head)

    def head_logits(self, states: torch.Tensor, i: int) -> torch.Tensor:
        """Logits [..., V_draft] of head ``i`` (0-based: it guesses ``i + 1`` tokens ahead)."""
        return torch.nn.functional.linear(self.blocks[i](states), self.head)

    def describe(self) -> dict:
        return {"num_heads": self.num_heads, **super().describe()}

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids):
        return cls(target_model, int(record["num_heads"]), vocab_ids, bool(record["train_head"]))


def load_medusa(path, target_model) -> MedusaHeads:
    """The Medusa heads at ``path``, checked against ``target_model``."""
    return load_head(MedusaHeads, path, target_model, "drafter.heads", "spec-zoo-train medusa")
