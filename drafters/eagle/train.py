"""``spec-zoo-train eagle``: train an EAGLE head (`spec_zoo.drafters.eagle.head.EagleHead`) for a target.

The pipeline is `spec_zoo.train.loop.train_module` (teacher data, losses, progress,
checkpoints, resume, seeds) with another module. The target stays frozen; its
last-layer features are computed once per training sequence and kept in memory, so a
step costs one decoder layer. Two losses: the distillation loss of ``cfg.loss`` on the
target's next-token distributions, plus ``head.regress`` x a smooth-L1 regression of the
head's predicted feature onto the target's (EAGLE's feature loss: it is what makes the
head's own features usable as input for the second and later draft tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.drafters.eagle.head import EagleHead
from spec_zoo.errors import ConfigError
from spec_zoo.layers import causal_mask
from spec_zoo.train.heads import HeadRecipe, HeadStudent
from spec_zoo.train.loop import train_module


class EagleStudent(HeadStudent):
    """An `EagleHead` (``lm``) reading the frozen target's last-layer features."""

    def __init__(self, target_model, head: EagleHead):
        super().__init__(target_model, head)
        self.regression = torch.zeros(())

    def target_states(self, ids: torch.Tensor) -> torch.Tensor:
        return self.stack.inner(input_ids=ids, use_cache=False).last_hidden_state

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Block outputs [B, L, H] of right-padded ``ids``; sets ``self.regression``."""
        feats = self.cached_states(ids, attention_mask.sum(1).tolist())
        before = torch.nn.functional.pad(feats[:, :-1], (0, 0, 1, 0))  # position i reads f_{i-1}
        hidden = self.lm.inputs(self.stack.embed(ids), before)
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)[None]
        out = self.lm(hidden, self.stack.rotary(hidden, positions), None, causal_mask(0, T, hidden.dtype, hidden.device))
        valid = attention_mask.bool()
        self.regression = torch.nn.functional.smooth_l1_loss(self.lm.feature(out)[valid], feats[valid])
        return out


class EagleRecipe(HeadRecipe):
    """What `spec-zoo-train eagle` trains: an `EagleHead` (section ``head``)."""

    desc, section, student = "eagle head", "head", EagleStudent

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        if float(cfg.head.regress) < 0:
            raise ConfigError(f"head.regress={cfg.head.regress}; the feature-loss weight must be >= 0.")

    def build(self, cfg: DictConfig, target_model, init_layer: int, vocab_ids) -> EagleHead:
        h = cfg.head
        return EagleHead(target_model, init_layer, bool(h.mlp), vocab_ids, bool(h.train_head))

    def extra_loss(self, student: EagleStudent, cfg: DictConfig) -> torch.Tensor:
        return float(cfg.head.regress) * student.regression


def train_eagle(cfg: DictConfig, target=None) -> Path:
    """Run ``spec-zoo-train eagle`` (conf/train_eagle.yaml); return the head dir."""
    return train_module(cfg, EagleRecipe(), target)
