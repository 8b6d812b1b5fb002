"""The distilled-draft recipe of ``spec-zoo-train distill`` (DistillSpec, Zhou et al. 2024):
which `Student` to build (from the target's first layers with a reduced draft vocabulary,
from an existing draft, or a LoRA adapter over one), what to train, and how to save it.
The data, loss, loop, checkpoints and progress are the generic `spec_zoo.train.loop`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from omegaconf import DictConfig, OmegaConf

from spec_zoo.artefacts import DEFAULT_QUANTIZE
from spec_zoo.drafters.distilled.student import (
    FORMAT,
    RECORD,
    Student,
    save_artefact,
    student_from_pretrained,
    student_from_target,
)
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.schema import NON_NEGATIVE, POSITIVE, Keys
from spec_zoo.train.batches import TeacherMetrics, draft_vocab, same_at_every_depth
from spec_zoo.train.data import TeacherData
from spec_zoo.train.loop import train_module
from spec_zoo.train.methods import register
from spec_zoo.train.recipe import Recipe
from spec_zoo.train.store import TeacherSet

INITS = ("target", "pretrained", "random")


@register("distill")
class DraftRecipe(TeacherMetrics):
    """What `spec-zoo-train distill` trains: a small draft model (`Student`), a
    `spec_zoo.train.recipe.Recipe`."""

    name: ClassVar[str]
    desc: ClassVar[str] = "distill"
    drafter: ClassVar[str] = "distilled"
    artefact: ClassVar[tuple[str, str]] = (RECORD, FORMAT)  # output.dir is checked against it first
    keys: ClassVar[Keys] = Keys(
        limits={"student.layers": POSITIVE, "student.vocab_size": NON_NEGATIVE},
        types={"student.path": ((str,), True), "student.copy_layers": ((list,), True)})
    chain_start: ClassVar[int] = 0

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        return cls()

    def check(self, cfg: DictConfig) -> None:
        if cfg.student.init not in INITS:
            raise ConfigError(f"student.init={cfg.student.init!r}; allowed values: {', '.join(INITS)}.")
        if cfg.student.init == "pretrained" and not cfg.student.path:
            raise ConfigError("student.init=pretrained needs student.path=DIR (an HF model dir or a distilled draft).")
        if cfg.student.lora.enabled and cfg.student.init != "pretrained":
            raise ConfigError("student.lora.enabled=true adapts an existing draft: "
                              "set student.init=pretrained student.path=DIR.")
        if cfg.student.path and not Path(cfg.student.path).expanduser().is_dir():
            raise ConfigError(f"student.path={cfg.student.path!r} is not a directory.")

    def make(self, cfg: DictConfig, target: Target, train: TeacherData) -> Student:
        return _make_student(cfg, target, train)

    def preload(self, student: Student, data: TeacherData, teacher: TeacherSet, cfg: DictConfig) -> None:
        """Nothing: a draft model reads tokens only."""

    def trainable(self, student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
        return _trainable(student, cfg)

    def save(self, student: Student, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        s = cfg.student
        init = {"kind": s.init, "path": s.path, "layers": int(s.layers),
                "copy_layers": None if s.copy_layers is None else list(s.copy_layers),
                "lora": OmegaConf.to_container(s.lora)}
        return save_artefact(student, Path(cfg.output.dir).expanduser(),
                             {"target": target_info, "init": init, **record}, dtype=str(cfg.output.dtype),
                             quantize=cfg.output.get("quantize", DEFAULT_QUANTIZE),
                             quantize_head=cfg.output.get("quantize_head"),
                             overwrite=bool(cfg.output.get("overwrite", False)))

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return student_from_pretrained(path, model)[0].eval()

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        return same_at_every_depth(student, ids, mask, where, t_ids, depth)


def _make_student(cfg: DictConfig, target: Target, train: TeacherData) -> Student:
    s = cfg.student
    if s.init == "pretrained":
        student, _ = student_from_pretrained(s.path, target.model)
        if s.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=int(s.lora.r), lora_alpha=int(s.lora.alpha), lora_dropout=float(s.lora.dropout),
                              target_modules=list(s.lora.target_modules), bias="none")
            student.lm = get_peft_model(student.lm, lora)
        return student
    vocab_ids = draft_vocab(target, train, int(s.vocab_size))
    copy_layers = list(s.copy_layers) if s.copy_layers is not None else None
    return student_from_target(target.model, int(s.layers), copy_layers, vocab_ids,
                               random_layers=s.init == "random", seed=int(cfg.train.seed))


def _trainable(student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
    base = student.base()
    for p in student.lm.parameters():
        p.requires_grad_(False)
    if cfg.student.lora.enabled:
        params = [p for n, p in student.lm.named_parameters() if "lora_" in n]
    else:
        params = [p for n, p in base.named_parameters() if "embed_tokens" not in n]
        if not cfg.student.train_head:
            params = [p for n, p in base.named_parameters() if "embed_tokens" not in n and "lm_head" not in n]
    for p in params:
        p.requires_grad_(True)
    return params


def distill(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run the pipeline of ``cfg`` (conf/train_distill.yaml); return the artefact dir.
    ``target``: an already loaded `Target` (tests pass a tiny one)."""
    return train_module(cfg, DraftRecipe.from_config(cfg), target)
