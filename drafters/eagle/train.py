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

``spec-zoo-train eagle3`` trains EAGLE-3's head instead (`Eagle3Recipe`): ``fc`` fuses the
target's states entering three layers (low, middle, high), the layer attends over the
embedding and the feature side by side, there is no feature regression (the fused input is
not a state the head could predict), and the artefact is written in a published layout
(vLLM ``speculators`` or the original ``eagle3``) that engines load as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import DynamicCache

from spec_zoo.artefacts import write_artefact
from spec_zoo.drafters.eagle.formats import Eagle3Head, default_layers, eagle3_files, load_published
from spec_zoo.drafters.eagle.head import EagleHead, load_eagle
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack
from spec_zoo.runtime.target import Target
from spec_zoo.schema import NON_NEGATIVE, Keys
from spec_zoo.train.batches import draft_vocab, right_at, teacher_positions
from spec_zoo.train.data import TeacherData
from spec_zoo.train.export import verifier_path
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


class Eagle3Student(EagleStudent):
    """An `Eagle3Head` (``lm``) reading the frozen target's states entering ``lm.target_layers``,
    side by side ([.., 3H]). Head position j pairs token j + 1 with the state of position j (the
    reference's alignment, as `EagleDrafter` drafts with it); its outputs are handed back at the
    sequence's positions (position j + 1), so the teacher rows line up as for the EAGLE head."""

    lm: Eagle3Head

    @property
    def states_name(self) -> str:
        return "layers" + "_".join(str(i) for i in self.lm.target_layers)

    @property
    def states_width(self) -> int:
        return int(self.lm.fc.in_features)

    def unroll(self, ids: torch.Tensor, attention_mask: torch.Tensor, steps: int,
               regress_steps: int) -> list[torch.Tensor]:
        """Layer outputs [B, L, H] at draft depths 1..``steps``: depth 1 reads the fused target
        states, depth s the head's own depth-(s - 1) output of the position before (EAGLE-3's
        training-time test); no feature regression."""
        states = self.cached_states(ids, attention_mask.sum(1).tolist())
        embeds = self.stack.embed(ids[:, 1:])
        T = embeds.shape[1]
        rotary = self.lm.rotary(embeds, torch.arange(T, device=ids.device)[None])
        cache, features, outs = DynamicCache(), states[:, :-1], []
        for s in range(steps):
            out = self.lm(self.lm.inputs(embeds, features), rotary, cache, ttt_mask(T, s, embeds.dtype, embeds.device))
            features = torch.nn.functional.pad(out[:, :-1], (0, 0, 1, 0))
            outs.append(torch.nn.functional.pad(out, (0, 0, 1, 0)))  # head position j is the sequence's j + 1
        self.regression = torch.zeros((), device=ids.device)
        return outs

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.logits(hidden)


@register("eagle3")
class Eagle3Recipe(EagleRecipe):
    """What `spec-zoo-train eagle3` trains: an `Eagle3Head` (section ``head``), saved in a
    published layout (``output.layout``) with the training record beside it (``RECORD``)."""

    desc, student = "eagle-3 head", Eagle3Student
    RECORD, FORMAT = "eagle3_training.json", "spec-zoo-eagle3-training"
    LAYOUTS = ("speculators", "eagle3")
    artefact = RECORD, FORMAT
    keys = EagleRecipe.keys | Keys(types={"head.target_layers": ((list, tuple), True)})  # layout: `check`

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        h = cfg.head
        if float(h.regress) != 0:
            raise ConfigError(f"head.regress={h.regress}; an EAGLE-3 head has no feature regression (its input "
                              "fuses three layers, no state it could predict): use head.regress=0.")
        if not bool(h.mlp):
            raise ConfigError("head.mlp=false; the EAGLE-3 layout holds a layer with its MLP: use head.mlp=true.")
        if str(cfg.output.layout) not in self.LAYOUTS:
            raise ConfigError(f"output.layout={cfg.output.layout!r}; use one of {', '.join(self.LAYOUTS)}.")

    def make(self, cfg: DictConfig, target, train: TeacherData) -> HeadStudent:
        h, L = cfg.head, DecoderStack(target.model).num_layers
        layers = default_layers(L) if h.target_layers is None else tuple(int(i) for i in h.target_layers)
        if not layers or not all(0 <= i < L for i in layers):
            raise ConfigError(f"head.target_layers={list(layers)}; the target has layers 0..{L - 1} (null: EAGLE-3's "
                              f"low, middle, high: {list(default_layers(L))}).")
        init = layers[-1] if h.init_layer is None else int(h.init_layer)
        if not 0 <= init < L:
            raise ConfigError(f"head.init_layer={h.init_layer}; the target has layers 0..{L - 1}.")
        head = Eagle3Head.from_target(target.model, layers, init, draft_vocab(target, train, int(h.vocab_size)))
        return self.student(target.model, head)

    def trainable(self, student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
        assert isinstance(student, Eagle3Student)
        params = super().trainable(student, cfg)
        frozen = set() if bool(cfg.head.train_head) else {id(student.lm.lm_head.weight)}
        return [p for p in params if id(p) not in frozen]

    def save(self, student: Student, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        from spec_zoo.models import DTYPES

        assert isinstance(student, Eagle3Student)
        config, write = eagle3_files(student.lm, str(cfg.output.layout), verifier_path(cfg),
                                     DTYPES[str(cfg.output.dtype)])

        def files(tmp: Path) -> None:
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
            write(tmp)

        full = {"format": self.FORMAT, "layout": str(cfg.output.layout), "target": target_info, **record}
        return write_artefact(cfg.output.dir, self.RECORD, full, files,
                              overwrite=bool(cfg.output.get("overwrite", False)))

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return Eagle3Student(model, load_published(path, model, "auto"))


def train_eagle(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train eagle`` (conf/train_eagle.yaml); return the head dir."""
    return train_module(cfg, EagleRecipe.from_config(cfg), target)


def train_eagle3(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train eagle3`` (conf/train_eagle3.yaml); return the head dir."""
    return train_module(cfg, Eagle3Recipe.from_config(cfg), target)
