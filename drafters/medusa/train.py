"""``spec-zoo-train medusa``: train Medusa heads (`spec_zoo.drafters.medusa.heads.MedusaHeads`)
for a target, Medusa-1 style: the target stays frozen.

The pipeline is `spec_zoo.train.loop.train_module` (teacher data: the target's own
continuations, cached; progress, checkpoints, resume, seeds). The target's last-layer
states are computed once per training sequence and kept in memory, so a step costs the
heads alone. The recipe brings its own loss (`MedusaRecipe.batch_metrics`): the state at
position j trains head i (0-based) on token j + 2 + i, i.e. i + 1 places after the token
the target's own LM head predicts there, with weight ``decay ** i`` (Medusa-1's 0.8^i):

* ``labels: tokens`` (the default, Medusa-1's choice): cross-entropy on the token the
  target actually wrote there (its greedy continuation): that token is what greedy
  verification accepts;
* ``labels: distributions``: the loss of ``loss`` (fkl / rkl / tvd) against the target's
  top-k distribution at that position (given the true prefix, which the head never sees).

Held-out metrics per head: greedy agreement with the target's argmax and 1 - TV, and the
expected tokens per step of a greedy chain of all heads (``tau_chain``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.drafters.medusa.heads import MedusaHeads, load_medusa
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.train.batches import AheadMetrics, draft_index, draft_vocab, right_at, teacher_positions
from spec_zoo.train.data import TeacherData
from spec_zoo.train.heads import HeadRecipe, HeadStudent
from spec_zoo.train.loop import train_module
from spec_zoo.train.losses import check_labels, label_loss
from spec_zoo.train.methods import register
from spec_zoo.train.recipe import Recipe, Student


class MedusaStudent(HeadStudent):
    """`MedusaHeads` (``lm``) reading the frozen target's last-layer states."""

    lm: MedusaHeads

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.cached_states(ids, attention_mask.sum(1).tolist())


@register("medusa")
class MedusaRecipe(HeadRecipe):
    """What `spec-zoo-train medusa` trains: `MedusaHeads` (section ``heads``). Head s drafts
    from the state s places before its token, so a report chain starts at the second token."""

    desc, drafter, section, student = "medusa heads", "medusa", "heads", MedusaStudent
    artefact = MedusaHeads.RECORD, MedusaHeads.FORMAT
    chain_start = 1

    def __init__(self, labels: str = "tokens", decay: float = 0.8):
        self.labels, self.decay = labels, decay

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        return cls(str(cfg.heads.labels), float(cfg.heads.decay))

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        h = cfg.heads
        if int(h.num_heads) < 1:
            raise ConfigError(f"heads.num_heads={h.num_heads}; Medusa needs at least one head (e.g. 4).")
        check_labels("heads.labels", h.labels)
        if not 0.0 < float(h.decay) <= 1.0:
            raise ConfigError(f"heads.decay={h.decay}; the weight of head i is decay^i, use a value in (0, 1].")

    def make(self, cfg: DictConfig, target: Target, train: TeacherData) -> MedusaStudent:
        h = cfg.heads
        heads = MedusaHeads(target.model, int(h.num_heads), draft_vocab(target, train, int(h.vocab_size)),
                            bool(h.train_head))
        return MedusaStudent(target.model, heads.to(target.model.dtype))

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        """Per-position values (see the module docstring): ``loss`` = sum over heads of
        decay^i x head i's loss (heads past a sequence's end left out)."""
        assert isinstance(student, MedusaStudent)
        ids, mask, where, t_ids, t_index, t_logp = teacher_positions(student, data, rows, full_vocab)
        states = student.hidden(ids, mask).reshape(-1, student.lm.head.shape[1])[where]  # [N, H]
        K = student.lm.num_heads
        written = draft_index(ids.reshape(-1)[where + 1], student.vocab_ids, full_vocab)  # what the target wrote
        metrics = AheadMetrics(data, rows, K, "head", with_agreement, where.device)
        for i in range(K):
            src, dst = metrics.rows(i + 1)  # states whose head i has a token to guess, its teacher row
            logits = student.lm.head_logits(states[src], i)
            head_loss = label_loss(self.labels, logits, written[dst], t_index[dst], t_logp[dst], kind)
            metrics.add(i, src, self.decay ** i * head_loss, logits, student.vocab_ids, t_ids, t_index, t_logp, dst)
        return metrics.result()


    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return MedusaStudent(model, load_medusa(path, model))

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Head s at the state s places before (``where - s``: the same sequence when ``local >= s``)."""
        assert isinstance(student, MedusaStudent)
        states = student.hidden(ids, mask).reshape(-1, student.lm.head.shape[1])
        cols = []
        for s in range(1, depth + 1):
            col = torch.zeros(len(where), dtype=torch.bool, device=where.device)
            if s <= student.lm.num_heads:
                ok = local >= s
                col[ok] = right_at(student.lm.head_logits(states[where[ok] - s], s - 1), student.vocab_ids, t_ids[ok])
            cols.append(col)
        return cols


def train_medusa(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train medusa`` (conf/train_medusa.yaml); return the heads dir."""
    return train_module(cfg, MedusaRecipe.from_config(cfg), target)
