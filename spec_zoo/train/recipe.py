"""What a trained method gives the training pipeline: its `Recipe` (what to build, what
trains, how it is saved and read back) and the `Student` that recipe trains. Typed
protocols, so the pipeline (`spec_zoo.train.loop`) and `spec-zoo-train report` call every
member of every recipe alike; a method registers its recipe from its own folder
(`spec_zoo.train.methods.register`, in ``drafters/<method>/train.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from omegaconf import DictConfig

from spec_zoo.schema import Keys
from spec_zoo.train.data import TeacherData
from spec_zoo.train.store import TeacherSet


class Student(Protocol):
    """The module a recipe trains, as the pipeline sees it: ``lm`` holds the weights that
    train and are saved, ``hidden`` maps a right-padded batch to the states ``head`` turns
    into draft logits over ``vocab_ids`` (None: the target's whole vocabulary)."""

    @property
    def lm(self) -> torch.nn.Module: ...

    @property
    def vocab_ids(self) -> torch.Tensor | None: ...

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...

    def head(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def eval(self) -> Any: ...


class Recipe(Protocol):
    """A trained method's recipe. ``name`` is its command (``spec-zoo-train <name>``, config
    ``conf/train_<name>.yaml``; set by `register`), ``desc`` the progress bar's label,
    ``drafter`` the drafter option its artefact serves, ``artefact`` the (record file,
    format) it writes, ``keys`` what its config keys' defaults cannot say (ranges, types of
    null defaults), ``chain_start`` the first continuation position a report chain may start
    at (1 for a draft that reads the state before it, Medusa)."""

    name: ClassVar[str]
    desc: ClassVar[str]
    drafter: ClassVar[str]
    artefact: ClassVar[tuple[str, str]]
    keys: ClassVar[Keys]
    chain_start: ClassVar[int]

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        """The recipe a training config asks for (``cls()`` gives the defaults, for reading artefacts)."""
        ...

    def check(self, cfg: DictConfig) -> None:
        """Cheap checks of the recipe's own keys, before any model loads (`ConfigError` naming the key)."""
        ...

    def make(self, cfg: DictConfig, target: Any, train: TeacherData) -> Student:
        """The untrained student for ``target`` (a `spec_zoo.runtime.target.Target`)."""
        ...

    def preload(self, student: Student, data: TeacherData, teacher: TeacherSet, cfg: DictConfig) -> None:
        """Give the student what it reads of the target from the teacher-data store (nothing,
        for a student that reads tokens only)."""
        ...

    def trainable(self, student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
        """The parameters that train (the rest frozen)."""
        ...

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        """Per-position values of a batch: ``loss``, and with ``with_agreement`` ``alpha_greedy``
        and ``alpha_sampled`` (and whatever else the recipe reports)."""
        ...

    def extra_loss(self, student: Student, cfg: DictConfig) -> torch.Tensor | None:
        """A term of the recipe's own added to the batch loss (None: none)."""
        ...

    def save(self, student: Student, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        """Write the artefact (``output.dir``); return its directory."""
        ...

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        """A written artefact as a (frozen) student of ``model``: what the report measures."""
        ...

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Per teacher row, for s = 1..``depth``: whether the depth-s draft of that token is the
        target's argmax (``local``: each row's place in its continuation)."""
        ...
