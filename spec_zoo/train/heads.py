"""Training a `spec_zoo.draft_head.BlockHead` next to a frozen target: what the exit
adapter (`spec_zoo.drafters.early_exit.train`) and the EAGLE head (`spec_zoo.drafters.eagle.train`) share.

The target never trains; the states the head reads from it are computed once per
training sequence and kept in memory, so a training step costs the head alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from omegaconf import DictConfig

from spec_zoo.artefacts import DEFAULT_QUANTIZE
from spec_zoo.draft_head import BlockHead, VocabHead, save_head
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack
from spec_zoo.schema import Keys
from spec_zoo.train.batches import TeacherMetrics, draft_vocab, same_at_every_depth
from spec_zoo.train.data import TeacherData
from spec_zoo.train.recipe import Recipe, Student
from spec_zoo.train.store import TeacherSet, named_states, state_layers


class HeadStudent(torch.nn.Module):
    """The `Student` interface of the training loop over a head (``lm``); subclasses say
    which target states it reads (`target_states`, named `states_name` in the teacher-data
    store; by default the last-layer features) and how (`hidden`)."""

    lm: VocabHead

    @property
    def states_name(self) -> str:
        return "final"

    @property
    def states_width(self) -> int:
        """The width of `target_states` (the target's hidden size, unless the head fuses several layers)."""
        return int(self.lm.head.shape[1])

    def _like(self) -> torch.Tensor:
        """A tensor of the head's device and dtype."""
        return next(self.lm.parameters())

    def __init__(self, target_model: torch.nn.Module, head: VocabHead):
        super().__init__()
        self.lm = head
        self.vocab_ids = head.vocab_ids
        self._stack = [DecoderStack(target_model)]  # a list: the target is not a submodule
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def stack(self) -> DecoderStack:
        return self._stack[0]

    def target_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The frozen target's states the head reads (`states_name`), [B, T, W], for a right-padded batch."""
        return named_states(self.stack.inner, ids.to(self.stack.model.device), [self.states_name])[self.states_name]

    def preload(self, data: TeacherData, states: list[torch.Tensor]) -> None:
        """Take `target_states` of ``data``'s sequences from the store instead of computing them."""
        lengths = (data.prompt_len + data.gen_len).tolist()
        device = self._like().device  # the store's dtype kept (a batch converts its rows): mapped, not copied
        for i, n in enumerate(lengths):
            self._cache[tuple(data.ids[i, :n].tolist())] = states[i].to(device)

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
        states = torch.zeros(ids.shape[0], ids.shape[1], self.states_width, dtype=self._like().dtype,
                             device=ids.device)
        for b, n in enumerate(lengths):
            states[b, :n] = self._cache[key[b]]
        return states

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The states the head reads, [B, L, H], for a right-padded batch (each head's own)."""
        raise NotImplementedError

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """A block head's logits over the draft vocabulary."""
        assert isinstance(self.lm, BlockHead)
        return self.lm.logits(hidden)


class HeadRecipe(TeacherMetrics):
    """A head's recipe (`spec_zoo.train.recipe.Recipe`; see the distilled draft's for a
    draft model): its config section (``section``: init_layer, mlp, vocab_size, train_head)
    builds it (`build`), only its parameters train, it reads the target's states from the
    teacher-data store, and it is saved with `save_head`. Subclasses name what they build and
    how it loads (`load`)."""

    name: ClassVar[str] = ""  # set by `spec_zoo.train.methods.register`
    desc: ClassVar[str] = ""
    drafter: ClassVar[str] = ""
    artefact: ClassVar[tuple[str, str]] = ("", "")  # (record file, format): output.dir is checked against it first
    keys: ClassVar[Keys] = Keys()
    chain_start: ClassVar[int] = 0
    section: ClassVar[str] = ""
    student: ClassVar[type[HeadStudent]] = HeadStudent

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        return cls()

    def check(self, cfg: DictConfig) -> None:
        if int(cfg[self.section].vocab_size) < 0:
            raise ConfigError(f"{self.section}.vocab_size={cfg[self.section].vocab_size}; use 0 (full vocabulary) "
                              "or a positive size.")

    def build(self, cfg: DictConfig, target_model: torch.nn.Module, init_layer: int,
              vocab_ids: torch.Tensor | None) -> BlockHead:
        raise NotImplementedError

    def make(self, cfg: DictConfig, target: Any, train: TeacherData) -> HeadStudent:
        s = cfg[self.section]
        layers = DecoderStack(target.model).num_layers
        init = layers - 1 if s.init_layer is None else int(s.init_layer)
        if not 0 <= init < layers:
            raise ConfigError(f"{self.section}.init_layer={s.init_layer}; the target has layers 0..{layers - 1}.")
        head = self.build(cfg, target.model, init, draft_vocab(target, train, int(s.vocab_size)))
        return self.student(target.model, head.to(target.model.dtype))

    def preload(self, student: Student, data: TeacherData, teacher: TeacherSet, cfg: DictConfig) -> None:
        """The target states the head reads, from the store (computed once per shard)."""
        assert isinstance(student, HeadStudent)
        name = student.states_name
        keep = tuple(str(n) for n in cfg.data.get("keep_states") or () if n != name)
        for other in keep:
            state_layers(other, student.stack.num_layers)  # refused before any forward

        def compute(ids: torch.Tensor) -> dict[str, torch.Tensor]:  # with data.keep_states: one forward for all
            if keep:
                return named_states(student.stack.inner, ids.to(student.stack.model.device), (name, *keep))
            return {name: student.target_states(ids)}  # the head's own path (the exit adapter's runs layers < E only)

        states = teacher.store.states(name, compute, int(cfg.data.batch_size), bool(cfg.progress), keep=keep)
        student.preload(data, states)

    def trainable(self, student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
        assert isinstance(student, HeadStudent)
        for p in student.stack.model.parameters():
            p.requires_grad_(False)
        return list(student.lm.parameters())

    def save(self, student: Student, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        from spec_zoo.models import DTYPES

        assert isinstance(student, HeadStudent)
        return save_head(student.lm, cfg.output.dir, target_info, record, dtype=DTYPES[str(cfg.output.dtype)],
                         quantize=cfg.output.get("quantize", DEFAULT_QUANTIZE),
                         quantize_head=cfg.output.get("quantize_head"),
                         overwrite=bool(cfg.output.get("overwrite", False)))

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        raise NotImplementedError

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        return same_at_every_depth(student, ids, mask, where, t_ids, depth)
