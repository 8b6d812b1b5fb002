"""``spec-zoo-train early_exit``: self-distil an exit adapter (Kangaroo-style).

The pipeline is `spec_zoo.train.distill.train_module` (teacher data, losses, progress,
checkpoints, resume, seeds) with another module: an `ExitAdapter` that reads the target's
own layer-E hidden states and learns the target's next-token distributions. The target
stays frozen; its layers 0..E-1 are run once per training sequence and their output is
kept in memory (the adapter is the only thing that trains), which makes a step cost one
decoder layer instead of E.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.draft_head import save_head
from spec_zoo.exit_adapter import ExitAdapter, check_exit_layer
from spec_zoo.layers import DecoderStack, causal_mask
from spec_zoo.train.data import TeacherData
from spec_zoo.train.distill import draft_vocab, train_module


class ExitStudent(torch.nn.Module):
    """The `Student` interface of the training loop over an `ExitAdapter` (``lm``): inputs
    are the frozen target's states entering layer E, cached per sequence."""

    def __init__(self, target_model, adapter: ExitAdapter):
        super().__init__()
        self.lm = adapter
        self.vocab_ids = adapter.vocab_ids
        self._stack = [DecoderStack(target_model)]  # a list: the target is not a submodule
        self._features: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def _exit_states(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """States entering layer E [B, L, H] (zeros after each sequence's end)."""
        stack = self._stack[0]
        missing = [b for b in range(ids.shape[0]) if tuple(ids[b, : lengths[b]].tolist()) not in self._features]
        if missing:
            T = max(lengths[b] for b in missing)
            batch = ids[missing, :T]
            hidden = stack.embed(batch)
            positions = torch.arange(T, device=batch.device)[None]
            out = stack.run(hidden, 0, self.lm.exit_layer, positions, None, causal_mask(0, T, hidden.dtype, hidden.device))
            for row, b in enumerate(missing):
                self._features[tuple(ids[b, : lengths[b]].tolist())] = out[row, : lengths[b]].clone()
        H = self.lm.head.shape[1]
        states = torch.zeros(ids.shape[0], ids.shape[1], H, dtype=self.lm.head.dtype, device=ids.device)
        for b, n in enumerate(lengths):
            states[b, :n] = self._features[tuple(ids[b, :n].tolist())]
        return states

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Adapted states [B, L, H] of right-padded ``ids``."""
        states = self._exit_states(ids, attention_mask.sum(1).tolist())
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)[None]
        rotary = self._stack[0].rotary(states, positions)
        return self.lm(states, rotary, None, causal_mask(0, T, states.dtype, states.device))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.logits(hidden)


class ExitRecipe:
    """What `spec-zoo-train early_exit` trains (see `spec_zoo.train.distill.DraftRecipe`)."""

    desc = "exit adapter"

    def check(self, cfg: DictConfig) -> None:
        a = cfg.adapter
        if int(a.exit_layer) < 1:
            raise ConfigError(f"adapter.exit_layer={a.exit_layer}; the exit must be a layer index >= 1.")
        if int(a.vocab_size) < 0:
            raise ConfigError(f"adapter.vocab_size={a.vocab_size}; use 0 (full vocabulary) or a positive size.")

    def make(self, cfg: DictConfig, target, train: TeacherData) -> ExitStudent:
        a = cfg.adapter
        layers = DecoderStack(target.model).num_layers
        check_exit_layer(int(a.exit_layer), layers, key="adapter.exit_layer")
        init = layers - 1 if a.init_layer is None else int(a.init_layer)
        adapter = ExitAdapter(target.model, int(a.exit_layer), init, bool(a.mlp),
                              draft_vocab(target, train, int(a.vocab_size)), bool(a.train_head))
        return ExitStudent(target.model, adapter.to(target.model.dtype))

    def trainable(self, student: ExitStudent, cfg: DictConfig) -> list[torch.nn.Parameter]:
        for p in student._stack[0].model.parameters():
            p.requires_grad_(False)
        return list(student.lm.parameters())

    def save(self, student: ExitStudent, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        from spec_zoo.models import DTYPES

        return save_head(student.lm, cfg.output.dir, target_info, record, dtype=DTYPES[str(cfg.output.dtype)])


def train_exit_adapter(cfg: DictConfig, target=None) -> Path:
    """Run ``spec-zoo-train early_exit`` (conf/train_early_exit.yaml); return the adapter dir."""
    return train_module(cfg, ExitRecipe(), target)
