"""``spec-zoo-train eagle``: train an EAGLE head (`spec_zoo.drafters.eagle.head.EagleHead`) for a target.

The pipeline is `spec_zoo.train.loop.train_module` (teacher data, losses, progress,
checkpoints, resume, seeds) with another module. The target stays frozen; its
last-layer features are computed once per training sequence and kept in memory, so a
step costs one decoder layer. Two losses: the distillation loss of ``cfg.loss`` on the
target's next-token distributions, plus ``head.regress`` x a smooth-L1 regression of the
head's predicted feature onto the target's (EAGLE's feature loss: it is what makes the
head's own features usable as input for the second and later draft tokens).

Training-time test (EAGLE-3, ``head.ttt_steps=k`` > 1): the head is also unrolled over
its own predicted features, as it drafts: at step s every position i reads its token and
the head's step-(s-1) feature of position i-1, and attends to the true-feature context up
to i-s+1 plus its own steps at i-s+2..i (the keys a depth-s draft sees at decode time).
All k steps are trained on the same teacher distributions; held-out metrics report the
greedy acceptance at every depth up to max(k, 3) (``alpha_depth<s>``: depth s given the
tokens before it were accepted), with or without the unrolled training.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import DynamicCache

from spec_zoo.drafters.eagle.head import EagleHead, load_eagle
from spec_zoo.errors import ConfigError
from spec_zoo.schema import NON_NEGATIVE, Keys
from spec_zoo.target import Target
from spec_zoo.train.batches import right_at, teacher_positions
from spec_zoo.train.data import TeacherData
from spec_zoo.train.heads import HeadRecipe, HeadStudent
from spec_zoo.train.loop import train_module
from spec_zoo.train.losses import agreement, divergence
from spec_zoo.train.methods import register
from spec_zoo.train.recipe import Recipe, Student


class EagleStudent(HeadStudent):
    """An `EagleHead` (``lm``) reading the frozen target's last-layer features."""

    lm: EagleHead

    def __init__(self, target_model: torch.nn.Module, head: EagleHead):
        super().__init__(target_model, head)
        self.regression = torch.zeros(())

    def unroll(self, ids: torch.Tensor, attention_mask: torch.Tensor, steps: int,
               regress_steps: int) -> list[torch.Tensor]:
        """Block outputs [B, L, H] of right-padded ``ids`` at draft depths 1..``steps`` (see the
        module docstring); sets ``self.regression`` (feature loss, mean over the first ``regress_steps``)."""
        feats = self.cached_states(ids, attention_mask.sum(1).tolist())
        embeds = self.stack.embed(ids)
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)[None]
        rotary = self.stack.rotary(embeds, positions)
        cache = DynamicCache()
        valid = attention_mask.bool()
        features, outs, regression = feats, [], []
        for s in range(steps):
            before = torch.nn.functional.pad(features[:, :-1], (0, 0, 1, 0))  # position i reads f_{i-1}
            out = self.lm(self.lm.inputs(embeds, before), rotary, cache, ttt_mask(T, s, embeds.dtype, embeds.device))
            features = self.lm.feature(out)
            outs.append(out)
            if s < regress_steps:
                regression.append(torch.nn.functional.smooth_l1_loss(features[valid], feats[valid]))
        self.regression = torch.stack(regression).mean()
        return outs

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Block outputs [B, L, H] from true features (depth 1); sets ``self.regression``."""
        return self.unroll(ids, attention_mask, 1, 1)[0]


def ttt_mask(T: int, step: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive [1, 1, T, (step + 1) T] mask of unroll step ``step`` (0-based) over the keys of
    steps 0..step: query i sees step 0 at positions <= i - step and step t at i - step + t."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None]
    allowed = [j <= i - step] + [j == i - step + t for t in range(1, step + 1)]
    mask = torch.zeros(T, (step + 1) * T, dtype=dtype)
    mask.masked_fill_(~torch.cat(allowed, 1), torch.finfo(dtype).min)
    return mask[None, None].to(device)


@register("eagle")
class EagleRecipe(HeadRecipe):
    """What `spec-zoo-train eagle` trains: an `EagleHead` (section ``head``)."""

    desc, drafter, section, student = "eagle head", "eagle", "head", EagleStudent
    artefact = EagleHead.RECORD, EagleHead.FORMAT
    keys = Keys(limits={"head.vocab_size": NON_NEGATIVE}, types={"head.init_layer": ((int,), True)})

    def __init__(self, ttt_steps: int = 1):
        self.ttt_steps = ttt_steps

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        return cls(int(cfg.head.ttt_steps))

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        if float(cfg.head.regress) < 0:
            raise ConfigError(f"head.regress={cfg.head.regress}; the feature-loss weight must be >= 0.")
        if int(cfg.head.ttt_steps) < 1:
            raise ConfigError(f"head.ttt_steps={cfg.head.ttt_steps}; use 1 (true features only) or the draft "
                              "depth to train at (e.g. 3).")

    def build(self, cfg: DictConfig, target_model: torch.nn.Module, init_layer: int,
              vocab_ids: torch.Tensor | None) -> EagleHead:
        h = cfg.head
        return EagleHead(target_model, init_layer, bool(h.mlp), vocab_ids, bool(h.train_head))

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        """Per-position values: ``loss`` = the mean over the ``ttt_steps`` unrolled depths; with
        ``with_agreement`` also each depth's greedy acceptance ``alpha_depth<s>`` (up to max(k, 3))."""
        assert isinstance(student, EagleStudent)
        ids, mask, where, t_ids, t_index, t_logp = teacher_positions(student, data, rows, full_vocab)
        depth = max(self.ttt_steps, 3) if with_agreement else self.ttt_steps
        outs = student.unroll(ids, mask, depth, self.ttt_steps)
        logits = [student.head(o.reshape(-1, o.shape[-1])[where]) for o in outs]
        out = {"loss": torch.stack([divergence(x, t_index, t_logp, kind) for x in logits[: self.ttt_steps]]).mean(0)}
        if with_agreement:
            out["alpha_greedy"], out["alpha_sampled"] = agreement(logits[0], student.vocab_ids, t_ids, t_index, t_logp)
            for s, x in enumerate(logits):
                out[f"alpha_depth{s + 1}"] = agreement(x, student.vocab_ids, t_ids, t_index, t_logp)[0]
        return out

    def extra_loss(self, student: Student, cfg: DictConfig) -> torch.Tensor | None:
        assert isinstance(student, EagleStudent)
        return float(cfg.head.regress) * student.regression

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return EagleStudent(model, load_eagle(path, model))

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Depth s reads the head's own s - 1 guessed features (unrolled)."""
        assert isinstance(student, EagleStudent)
        outs = student.unroll(ids, mask, depth, 1)
        return [right_at(student.head(o.reshape(-1, o.shape[-1])[where]), student.vocab_ids, t_ids) for o in outs]


def train_eagle(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train eagle`` (conf/train_eagle.yaml); return the head dir."""
    return train_module(cfg, EagleRecipe.from_config(cfg), target)
