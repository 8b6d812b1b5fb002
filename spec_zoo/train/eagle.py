"""``spec-zoo-train eagle``: train an EAGLE head (`spec_zoo.eagle.EagleHead`) for a target.

The pipeline is `spec_zoo.train.distill.train_module` (teacher data, losses, progress,
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

from spec_zoo.draft_head import save_head
from spec_zoo.eagle import EagleHead
from spec_zoo.errors import ConfigError
from spec_zoo.layers import DecoderStack, causal_mask
from spec_zoo.train.data import TeacherData
from spec_zoo.train.distill import draft_vocab, train_module


class EagleStudent(torch.nn.Module):
    """The `Student` interface of the training loop over an `EagleHead` (``lm``)."""

    def __init__(self, target_model, head: EagleHead):
        super().__init__()
        self.lm = head
        self.vocab_ids = head.vocab_ids
        self._stack = [DecoderStack(target_model)]  # a list: the target is not a submodule
        self._features: dict[tuple[int, ...], torch.Tensor] = {}
        self.regression = torch.zeros(())

    @torch.no_grad()
    def _target_features(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The target's last-layer features [B, L, H] (zeros after each sequence's end)."""
        inner = self._stack[0].inner
        key = [tuple(ids[b, :n].tolist()) for b, n in enumerate(lengths)]
        missing = [b for b in range(ids.shape[0]) if key[b] not in self._features]
        if missing:
            T = max(lengths[b] for b in missing)
            out = inner(input_ids=ids[missing, :T], use_cache=False).last_hidden_state
            for row, b in enumerate(missing):
                self._features[key[b]] = out[row, : lengths[b]].clone()
        feats = torch.zeros(ids.shape[0], ids.shape[1], self.lm.head.shape[1], dtype=self.lm.head.dtype)
        for b, n in enumerate(lengths):
            feats[b, :n] = self._features[key[b]]
        return feats.to(ids.device)

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Block outputs [B, L, H] of right-padded ``ids``; sets ``self.regression``."""
        lengths = attention_mask.sum(1).tolist()
        feats = self._target_features(ids, lengths)
        before = torch.nn.functional.pad(feats[:, :-1], (0, 0, 1, 0))  # position i reads f_{i-1}
        stack = self._stack[0]
        hidden = self.lm.inputs(stack.embed(ids), before)
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)[None]
        out = self.lm(hidden, stack.rotary(hidden, positions), None, causal_mask(0, T, hidden.dtype, hidden.device))
        valid = attention_mask.bool()
        self.regression = torch.nn.functional.smooth_l1_loss(self.lm.feature(out)[valid], feats[valid])
        return out

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.logits(hidden)


class EagleRecipe:
    """What `spec-zoo-train eagle` trains (see `spec_zoo.train.distill.DraftRecipe`)."""

    desc = "eagle head"

    def check(self, cfg: DictConfig) -> None:
        h = cfg.head
        if int(h.vocab_size) < 0:
            raise ConfigError(f"head.vocab_size={h.vocab_size}; use 0 (full vocabulary) or a positive size.")
        if float(h.regress) < 0:
            raise ConfigError(f"head.regress={h.regress}; the feature-loss weight must be >= 0.")

    def make(self, cfg: DictConfig, target, train: TeacherData) -> EagleStudent:
        h = cfg.head
        layers = DecoderStack(target.model).num_layers
        init = layers - 1 if h.init_layer is None else int(h.init_layer)
        if not 0 <= init < layers:
            raise ConfigError(f"head.init_layer={h.init_layer}; the target has layers 0..{layers - 1}.")
        head = EagleHead(target.model, init, bool(h.mlp), draft_vocab(target, train, int(h.vocab_size)),
                         bool(h.train_head))
        return EagleStudent(target.model, head.to(target.model.dtype))

    def trainable(self, student: EagleStudent, cfg: DictConfig) -> list[torch.nn.Parameter]:
        for p in student._stack[0].model.parameters():
            p.requires_grad_(False)
        return list(student.lm.parameters())

    def extra_loss(self, student: EagleStudent, cfg: DictConfig) -> torch.Tensor:
        return float(cfg.head.regress) * student.regression

    def save(self, student: EagleStudent, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        from spec_zoo.models import DTYPES

        return save_head(student.lm, cfg.output.dir, target_info, record, dtype=DTYPES[str(cfg.output.dtype)])


def train_eagle(cfg: DictConfig, target=None) -> Path:
    """Run ``spec-zoo-train eagle`` (conf/train_eagle.yaml); return the head dir."""
    return train_module(cfg, EagleRecipe(), target)
