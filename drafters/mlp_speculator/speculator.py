"""The MLP speculator (IBM's ``fms-extras`` ``MLPSpeculator``, vLLM ``mlp_speculator``): a
small multi-stage MLP on the target's last hidden state, and its artefact format.

Stage 0 starts from the target's state h that chose the last committed token; stage i reads
the previous stage's state and the embedding of the token drafted before it (stage 0: the
last committed token)::

    state_i  = GELU(LN_i(W_s,i state_{i-1} + r W_e,i emb(token_{i-1})))
    logits_i = head_i(state_i)

with h layer-normalised and divided by sqrt(2) on the way in and r = emb_weight / state_weight,
fms-extras' weighting (state_weight = 0.5^(0.5/K), emb_weight = sqrt((1 - state_weight^2) H / 2)).
Unlike fms-extras, which trains a vocabulary-sized embedding and head per stage, the token
embeddings are the target's (frozen, `spec_zoo.draft_head.StagedHead.embed`) and head_i is a
per-stage H x H projection (identity at the start) followed by the target's LM-head rows of
the draft vocabulary (frozen and not stored unless ``train_head``): an artefact of 12 H^2
numbers per 4 stages (8 MB in fp16 for SmolLM2-135M) instead of 2 K V H.
"""

from __future__ import annotations

import math

import torch

from spec_zoo.draft_head import StagedHead, load_head
from spec_zoo.errors import ConfigError


class MLPSpeculator(StagedHead):
    """States [N, H] -> K stages, each a state [N, H] and logits [N, V_draft]."""

    FORMAT, RECORD = "spec-zoo-mlp-speculator", "mlp_speculator.json"
    WEIGHTS, WHAT = "mlp_speculator.safetensors", "MLP speculator"

    def __init__(self, target_model, num_stages: int, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        if int(num_stages) < 1:
            raise ConfigError(f"speculator.num_stages={num_stages}; the MLP speculator needs at least one stage "
                              "(e.g. 4).")
        super().__init__(target_model, num_stages, vocab_ids, train_head)
        K = self.num_stages
        hidden, dtype = self.head.shape[1], self.head.dtype

        def linears() -> torch.nn.ModuleList:
            return torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=False, dtype=dtype) for _ in range(K))

        self.state_proj, self.token_proj, self.out_proj = linears(), linears(), linears()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden, dtype=dtype) for _ in range(K))
        for proj in self.out_proj:
            assert isinstance(proj, torch.nn.Linear)
            torch.nn.init.eye_(proj.weight)
        state_weight = 0.5 ** (0.5 / K)
        self.token_scale = math.sqrt((1 - state_weight ** 2) * hidden / 2) / state_weight

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(hidden, hidden.shape[-1:]) / math.sqrt(2)

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        mixed = self.state_proj[stage](state) + self.token_scale * self.token_proj[stage](self.embed(tokens))
        return torch.nn.functional.gelu(self.norms[stage](mixed))

    def logits(self, stage: int, state: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self.out_proj[stage](state), self.head)

    def describe(self) -> dict:
        return {"num_stages": self.num_stages, **super().describe()}

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids):
        return cls(target_model, int(record["num_stages"]), vocab_ids, bool(record["train_head"]))


def load_speculator(path, target_model) -> MLPSpeculator:
    """The MLP speculator at ``path``, checked against ``target_model``."""
    return load_head(MLPSpeculator, path, target_model, "drafter.heads", "spec-zoo-train mlp_speculator")
