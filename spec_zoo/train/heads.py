"""Training a `spec_zoo.draft_head.BlockHead` next to a frozen target: what the exit
adapter (`spec_zoo.drafters.early_exit.train`) and the EAGLE head (`spec_zoo.drafters.eagle.train`) share.

The target never trains; the states the head reads from it are computed once per
training sequence and kept in memory, so a training step costs the head alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.draft_head import BlockHead, save_head
from spec_zoo.errors import ConfigError
from spec_zoo.layers import DecoderStack


class HeadStudent(torch.nn.Module):
    """The `Student` interface of the training loop over a head (``lm``); subclasses say
    which target states it reads (`target_states`, named `states_name` in the teacher-data
    store; by default the last-layer features) and how (`hidden`)."""

    @property
    def states_name(self) -> str:
        return "final"

    def __init__(self, target_model, head: BlockHead):
        super().__init__()
        self.lm = head
        self.vocab_ids = head.vocab_ids
        self._stack = [DecoderStack(target_model)]  # a list: the target is not a submodule
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def stack(self) -> DecoderStack:
        return self._stack[0]

    def target_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The frozen target's states the head reads, [B, T, H], for a right-padded batch."""
        return self.stack.inner(input_ids=ids.to(self.stack.model.device), use_cache=False).last_hidden_state

    def preload(self, data, states: list[torch.Tensor]) -> None:
        """Take `target_states` of ``data``'s sequences from the store instead of computing them."""
        lengths = (data.prompt_len + data.gen_len).tolist()
        for i, n in enumerate(lengths):
            self._cache[tuple(data.ids[i, :n].tolist())] = states[i].to(self.lm.head.device, self.lm.head.dtype)

    @torch.no_grad()
    def cached_states(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """`target_states` of each sequence, computed once (zeros after each sequence's end)."""
        key = [tuple(ids[b, :n].tolist()) for b, n in enumerate(lengths)]
        missing = [b for b in range(ids.shape[0]) if key[b] not in self._cache]
        if missing:
            T = max(lengths[b] for b in missing)
            out = self.target_states(ids[missing, :T])
            for row, b in enumerate(missing):
                self._cache[key[b]] = out[row, : lengths[b]].clone()
        states = torch.zeros(ids.shape[0], ids.shape[1], self.lm.head.shape[1], dtype=self.lm.head.dtype,
                             device=ids.device)
        for b, n in enumerate(lengths):
            states[b, :n] = self._cache[key[b]]
        return states

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.logits(hidden)


class HeadRecipe:
    """A head's recipe (see `spec_zoo.drafters.distilled.train.DraftRecipe`): its config section
    (``section``: init_layer, mlp, vocab_size, train_head) builds it (`build`), only its
    parameters train, and it is saved with `save_head`."""

    section = ""
    student = HeadStudent
    artefact = ("", "")  # (record file, format) of what it writes: output.dir is checked against it first

    def check(self, cfg: DictConfig) -> None:
        if int(cfg[self.section].vocab_size) < 0:
            raise ConfigError(f"{self.section}.vocab_size={cfg[self.section].vocab_size}; use 0 (full vocabulary) "
                              "or a positive size.")

    def build(self, cfg: DictConfig, target_model, init_layer: int, vocab_ids) -> BlockHead:
        raise NotImplementedError

    def make(self, cfg: DictConfig, target, train) -> HeadStudent:
        from spec_zoo.train.loop import draft_vocab

        s = cfg[self.section]
        layers = DecoderStack(target.model).num_layers
        init = layers - 1 if s.init_layer is None else int(s.init_layer)
        if not 0 <= init < layers:
            raise ConfigError(f"{self.section}.init_layer={s.init_layer}; the target has layers 0..{layers - 1}.")
        head = self.build(cfg, target.model, init, draft_vocab(target, train, int(s.vocab_size)))
        return self.student(target.model, head.to(target.model.dtype))

    def trainable(self, student: HeadStudent, cfg: DictConfig) -> list[torch.nn.Parameter]:
        for p in student.stack.model.parameters():
            p.requires_grad_(False)
        return list(student.lm.parameters())

    def save(self, student: HeadStudent, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        from spec_zoo.models import DTYPES

        return save_head(student.lm, cfg.output.dir, target_info, record, dtype=DTYPES[str(cfg.output.dtype)],
                         overwrite=bool(cfg.output.get("overwrite", False)))
