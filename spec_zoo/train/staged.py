"""Training a `spec_zoo.draft_head.StagedHead` (the MLP speculator, the Hydra heads) next to a
frozen target: what ``spec-zoo-train mlp_speculator`` and ``spec-zoo-train hydra`` share.

The target's last-layer states come from the teacher-data store (computed once per shard,
as for Medusa). Stages are teacher-forced on the tokens the target wrote: the state h_j at
position j (whose own next token, the target's, is x_{j+1}) starts stage 0, stage i reads
x_{j+1+i} and is trained on x_{j+2+i}, weight ``decay ** i`` (Medusa-1's per-head decay),
stages past a sequence's end left out. ``labels: tokens``: cross-entropy on the written token;
``labels: distributions``: the loss of ``loss`` against the target's top-k distribution there
(Hydra++'s teacher distillation: a stage reads the true prefix, so that distribution is the one
it is asked for). Under greedy decoding a chain's stage i
reads exactly these tokens whenever stages 0..i-1 were right, so the held-out ``tau_chain``
(1 + the leading stages that are right) is a greedy chain's expected tokens per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from omegaconf import DictConfig

from spec_zoo.draft_head import StagedHead, load_head
from spec_zoo.errors import ConfigError
from spec_zoo.train.batches import AheadMetrics, draft_index, draft_vocab, right_at, teacher_positions
from spec_zoo.train.data import TeacherData
from spec_zoo.train.heads import HeadRecipe, HeadStudent
from spec_zoo.train.losses import check_labels, label_loss
from spec_zoo.train.recipe import Recipe, Student


class StagedStudent(HeadStudent):
    """A `StagedHead` (``lm``) reading the frozen target's last-layer states."""

    lm: StagedHead

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.cached_states(ids, attention_mask.sum(1).tolist())


class StagedRecipe(HeadRecipe):
    """A staged head's recipe: its config section (``section``) holds the number of stages
    (``size_key``), ``vocab_size``, ``train_head`` and ``decay``; a method names its head
    class (``head_class``) and registers the recipe (`spec_zoo.train.methods.register`)."""

    chain_start = 1  # stage 0 reads the state before the token it follows
    student: ClassVar[type[HeadStudent]] = StagedStudent
    head_class: ClassVar[type[StagedHead]]
    size_key: ClassVar[str]

    def __init__(self, decay: float = 0.8, labels: str = "tokens"):
        self.decay, self.labels = decay, labels

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        s = cfg[cls.section]
        return cls(float(s.decay), str(s.labels))

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        s = cfg[self.section]
        if int(s[self.size_key]) < 1:
            raise ConfigError(f"{self.section}.{self.size_key}={s[self.size_key]}; use at least one (e.g. 4).")
        if not 0.0 < float(s.decay) <= 1.0:
            raise ConfigError(f"{self.section}.decay={s.decay}; stage i weighs decay^i in the loss, use a value "
                              "in (0, 1].")
        check_labels(f"{self.section}.labels", s.labels)

    def make(self, cfg: DictConfig, target: Any, train: TeacherData) -> StagedStudent:
        s = cfg[self.section]
        head = self.head_class(target.model, int(s[self.size_key]), draft_vocab(target, train, int(s.vocab_size)),
                               bool(s.train_head))
        return StagedStudent(target.model, head.to(target.model.dtype))

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return StagedStudent(model, load_head(self.head_class, path, model, "report.artefacts",
                                              f"spec-zoo-train {self.name}"))

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        """Per-position values (see the module docstring): ``loss`` = sum over stages of
        decay^i x stage i's loss; with agreement, per stage greedy agreement
        (``stage<i>_greedy``) and 1 - TV (``stage<i>_sampled``), and ``tau_chain``."""
        assert isinstance(student, StagedStudent)
        head: StagedHead = student.lm
        ids, mask, where, t_ids, t_index, t_logp = teacher_positions(student, data, rows, full_vocab)
        device = where.device
        states = student.hidden(ids, mask).reshape(-1, head.head.shape[1])[where]  # [N, H]: h_j
        K = head.num_stages
        written = ids.reshape(-1)[where + 1]  # x_{j+1}, the token the target wrote after h_j
        labels = draft_index(written, student.vocab_ids, full_vocab)
        metrics = AheadMetrics(data, rows, K, "stage", with_agreement, device)
        N = where.numel()
        state = head.start(states)
        for i in range(K):
            state = head.advance(i, state, written[(torch.arange(N, device=device) + i).clamp(max=N - 1)])
            src, dst = metrics.rows(i + 1)  # rows whose stage i has a token to guess, its teacher row
            logits = head.logits(i, state[src])
            stage_loss = label_loss(self.labels, logits, labels[dst], t_index[dst], t_logp[dst], kind)
            metrics.add(i, src, self.decay ** i * stage_loss, logits, student.vocab_ids, t_ids, t_index, t_logp, dst)
        return metrics.result()

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Stage s - 1 at the state s places before (``where - s``: the same sequence when
        ``local >= s``), fed the tokens written in between."""
        assert isinstance(student, StagedStudent)
        head: StagedHead = student.lm
        states = student.hidden(ids, mask).reshape(-1, head.head.shape[1])
        flat = ids.reshape(-1)
        cols = []
        for s in range(1, depth + 1):
            col = torch.zeros(len(where), dtype=torch.bool, device=where.device)
            if s <= head.num_stages:
                ok = local >= s
                base = where[ok] - s
                state = head.start(states[base])
                for i in range(s):
                    state = head.advance(i, state, flat[base + 1 + i])
                col[ok] = right_at(head.logits(s - 1, state), student.vocab_ids, t_ids[ok])
            cols.append(col)
        return cols
