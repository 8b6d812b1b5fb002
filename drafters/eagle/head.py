"""The EAGLE feature head (Li et al. 2024): draft from the target's own last-layer features.

A stand-alone draft model has to re-derive, from tokens alone, what the target already
computed; on a small CPU budget it cannot (see docs/distill.md). The target's last-layer
feature at position i (its final-norm output, what its LM head reads) already encodes
the next token; what the draft cannot know is the token the target then picks. So the
head reads both: at position i its input is ``fc([embed(x_i), f_{i-1}])``, one decoder
layer (own KV cache) turns that into ``g_i``, and ``norm(g_i)`` is its guess of the
target's feature ``f_i``: the draft-vocabulary head reads it to propose ``x_{i+1}``.

The first draft token sees only true target features (free: verification computes
them); later ones feed the head's own predicted feature back in (EAGLE's
auto-regression at the feature level), which training teaches with a feature
regression loss next to the distillation loss.
"""

from __future__ import annotations

import torch

from spec_zoo.draft_head import BlockHead, load_head


class EagleHead(BlockHead):
    """``fc`` + `BlockHead` (see the module docstring). At initialisation ``fc`` passes the
    token embedding through and ignores the feature, so with the block copied from the
    target's layer 0 the head starts as a one-layer truncated target and learns to read
    the features from there."""

    FORMAT, RECORD, WEIGHTS, WHAT = "spec-zoo-eagle-head", "eagle.json", "eagle.safetensors", "EAGLE head"

    def __init__(self, target_model, init_layer: int, mlp: bool = True, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        super().__init__(target_model, init_layer, mlp, vocab_ids, train_head)
        H = self.head.shape[1]
        self.fc = torch.nn.Linear(2 * H, H, bias=False, dtype=self.head.dtype)
        with torch.no_grad():  # start as "the block on the token alone": features enter as training finds them useful
            self.fc.weight.zero_()
            self.fc.weight[:, :H].copy_(torch.eye(H, dtype=self.head.dtype))

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Block input [B, q, H] from token embeddings and the features of the positions before.
        Features are RMS-normalised first (a final-norm feature is ~12x the scale of an
        embedding in SmolLM2, which would drown the token the target just picked)."""
        return self.fc(torch.cat([embeds, _unit_rms(features)], dim=-1))

    def feature(self, out: torch.Tensor) -> torch.Tensor:
        """The head's guess of the target's last-layer feature (what its LM head reads)."""
        return self.norm(out)

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids):
        return cls(target_model, int(record["init_layer"]), bool(record["mlp"]), vocab_ids, bool(record["train_head"]))


def _unit_rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def load_eagle(path, target_model) -> EagleHead:
    """The EAGLE head at ``path``, checked against ``target_model``."""
    return load_head(EagleHead, path, target_model, "drafter.head", "spec-zoo-train eagle")
