"""``spec-zoo-train parallel``: a distilled draft trained to draft k tokens in one forward
with mask tokens (PARD, arXiv 2504.18583), on the shared teacher-data store.

The student is a distilled draft (``parallel.base``, default the shipped one) with k - 1 mask
embeddings and, with ``parallel.update=low_rank``, a low-rank update of its ``parallel.modules``
(``parallel.rank``; the base stays frozen, so the artefact holds only what training changed), or
with ``parallel.update=full`` every weight of the draft trained (PARD's recipe: the rows of real
tokens and of masks share all of it, so fitting the masks need not pull the first token's row
through a shared rank-r update; the artefact holds the dense change of each weight). One forward trains every offset at
every teacher position (PARD's layout): after the sequence come k - 1 masks per anchor j, at
positions j + 1 .. j + k - 1, each seeing the real tokens up to j and the masks of its own anchor
before it (`ParallelStudent.anchored`: exactly what a decode step's forward sees). The anchor's
own row learns the teacher's distribution of token j + 1, mask i's row that of token j + 1 + i
(the target's distribution there, given the text it wrote); offsets past a sequence's end are
left out, and each row's loss is the sum over its offsets, offset i weighted ``parallel.decay ** i``
(Medusa-1's per-head decay: the later, harder offsets do not swamp the first, which the real
tokens' weights also serve).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import torch
from omegaconf import DictConfig

from spec_zoo.artefacts import DEFAULT_QUANTIZE
from spec_zoo.drafters.distilled.drafter import SHIPPED as SHIPPED_DISTILLED
from spec_zoo.drafters.distilled.student import Student, student_from_pretrained
from spec_zoo.drafters.parallel.model import (
    FORMAT,
    MASKS,
    RECORD,
    MaskedEmbedding,
    apply_updates,
    base_dir,
    read_parallel,
    save_parallel,
    weights_digest,
)
from spec_zoo.errors import ConfigError
from spec_zoo.models import DTYPES
from spec_zoo.runtime.target import Target
from spec_zoo.schema import POSITIVE, Keys, Limit
from spec_zoo.train.batches import AheadMetrics, right_at, teacher_positions
from spec_zoo.train.data import TeacherData
from spec_zoo.train.losses import divergence
from spec_zoo.train.methods import register
from spec_zoo.train.recipe import Recipe
from spec_zoo.train.store import TeacherSet


class LowRank(torch.nn.Module):
    """A frozen linear layer plus a trained low-rank update (LoRA, Hu et al. 2021): W x + s B A x,
    B zero at first, so the student starts as its base."""

    def __init__(self, linear: torch.nn.Linear, rank: int, scale: float):
        super().__init__()
        self.linear, self.scale = linear, scale
        self.down = torch.nn.Parameter(torch.empty(rank, linear.in_features, dtype=linear.weight.dtype))
        torch.nn.init.kaiming_uniform_(self.down, a=math.sqrt(5))
        self.up = torch.nn.Parameter(torch.zeros(linear.out_features, rank, dtype=linear.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + (x @ self.down.T) @ self.up.T * self.scale


class ParallelStudent(Student):
    """A distilled draft (``base``) reading k - 1 mask tokens (``masks`` [k - 1, H], trained, kept
    in ``lm`` so checkpoints hold them)."""

    def __init__(self, base: Student, masks: torch.Tensor):
        super().__init__(base.lm, base.vocab_ids, base.embed[0])
        self.lm.register_parameter(MASKS, torch.nn.Parameter(masks.detach().clone().float()))
        self.k = int(masks.shape[0]) + 1

    def embedding(self) -> MaskedEmbedding:
        embed = self.embed[0] if self.embed[0] is not None else self.base().model.embed_tokens
        return MaskedEmbedding(embed, getattr(self.lm, MASKS))

    def anchored(self, ids: torch.Tensor, attention_mask: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """States [N, k, H] of each anchor of the right-padded batch ``ids`` (``where``: flat
        positions b * L + j, grouped by row): its own state, then those of the k - 1 masks
        placed after it, all in one forward with a 4-D attention mask."""
        B, L = ids.shape
        M, device = self.k - 1, ids.device
        row, pos = where // L, where % L
        counts = torch.bincount(row, minlength=B)
        slot = torch.arange(len(where), device=device) - (counts.cumsum(0) - counts)[row]  # anchor's place in its row
        T = L + int(counts.max()) * M
        embed = self.embedding()
        tokens = torch.zeros(B, T, dtype=torch.long, device=device)
        tokens[:, :L] = ids
        positions = torch.arange(T, device=device).repeat(B, 1)
        cols = L + slot[:, None] * M + torch.arange(M, device=device)  # [N, M]: each anchor's masks
        tokens[row[:, None], cols] = embed.first + torch.arange(M, device=device)
        positions[row[:, None], cols] = pos[:, None] + 1 + torch.arange(M, device=device)
        allowed = torch.zeros(B, T, T, dtype=torch.bool, device=device)
        causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
        allowed[:, :L, :L] = causal & attention_mask[:, None, :].bool()
        seen = torch.arange(L, device=device)[None, :] <= pos[:, None]  # [N, L]: real tokens up to the anchor
        allowed[row[:, None, None], cols[:, :, None], torch.arange(L, device=device)] = seen[:, None, :]
        own = torch.ones(M, M, dtype=torch.bool, device=device).tril()
        allowed[row[:, None, None], cols[:, :, None], cols[:, None, :]] = own
        allowed[:, torch.arange(T), torch.arange(T)] = True  # unused slots see themselves (no empty rows)
        dtype = next(self.lm.parameters()).dtype
        additive = torch.zeros(B, 1, T, T, dtype=dtype, device=device).masked_fill(~allowed[:, None],
                                                                                   torch.finfo(dtype).min)
        hidden = self.base().model(inputs_embeds=embed(tokens), attention_mask=additive, position_ids=positions,
                                   use_cache=False).last_hidden_state
        return torch.cat([hidden[row, pos][:, None], hidden[row[:, None], cols]], 1)


def add_low_rank(lm: torch.nn.Module, rank: int, scale: float, modules: list[str]) -> int:
    """Wrap every linear layer of the decoder layers named in ``modules`` in a `LowRank`; return how many."""
    found = [(name, m) for name, m in lm.named_modules()
             if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}" and name.rsplit(".", 1)[-1] in modules]
    for name, linear in found:
        parent, child = name.rsplit(".", 1)
        setattr(lm.get_submodule(parent), child, LowRank(linear, rank, scale))
    return len(found)


def low_rank_updates(lm: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base weight name: (scale x up, down)} of every `LowRank` in ``lm``."""
    return {f"{name}.weight": (m.up * m.scale, m.down) for name, m in lm.named_modules() if isinstance(m, LowRank)}


def full_updates(lm: torch.nn.Module, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{weight name: trained - base} of every weight ``parallel.update=full`` trained that moved."""
    return {name: (p.detach().float() - base[name]) for name, p in lm.named_parameters()
            if name in base and not torch.equal(p.detach().float(), base[name])}


UPDATES = ("low_rank", "full")


@register("parallel")
class ParallelRecipe:
    """What `spec-zoo-train parallel` trains: a `ParallelStudent` (section ``parallel``)."""

    name: ClassVar[str]
    desc: ClassVar[str] = "parallel draft"
    drafter: ClassVar[str] = "parallel"
    artefact: ClassVar[tuple[str, str]] = (RECORD, FORMAT)
    keys: ClassVar[Keys] = Keys(
        limits={"parallel.k": Limit(low=2, example="4"), "parallel.rank": POSITIVE,
                "parallel.alpha": Limit(low=0, low_open=True, example="32"),
                "parallel.decay": Limit(low=0, low_open=True, high=1, example="0.8")},
        types={"parallel.base": ((str,), True)}, choices={"parallel.update": UPDATES})
    chain_start: ClassVar[int] = 0

    def __init__(self, decay: float = 0.8, update: str = "low_rank"):
        self.decay, self.update = decay, update
        self.start: dict[str, torch.Tensor] = {}  # update=full: the base's weights (the artefact holds the change)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Recipe:
        return cls(float(cfg.parallel.decay), str(cfg.parallel.get("update", "low_rank")))

    def check(self, cfg: DictConfig) -> None:
        p = cfg.parallel
        if cfg.output.get("quantize_head"):
            raise ConfigError(f"output.quantize_head={cfg.output.quantize_head}: a parallel draft stores no output "
                              "layer (it reads its base's); leave it null.")
        if int(p.k) < 2 or int(p.rank) < 1:
            raise ConfigError(f"parallel.k={p.k}, parallel.rank={p.rank}: need k >= 2 (the real token's row and at "
                              "least one mask) and rank >= 1, e.g. parallel.k=4 parallel.rank=32.")
        if float(p.alpha) <= 0 or not 0 < float(p.decay) <= 1:
            raise ConfigError(f"parallel.alpha={p.alpha}, parallel.decay={p.decay}: need alpha > 0 and decay in "
                              "(0, 1].")
        if p.base and not Path(p.base).expanduser().is_dir():
            raise ConfigError(f"parallel.base={p.base!r} is not a directory; give a distilled draft "
                              "(`spec-zoo-train distill`), or null for the shipped one.")
        if not p.base and not SHIPPED_DISTILLED.is_dir():
            raise ConfigError(f"parallel.base=null but the shipped distilled draft is missing ({SHIPPED_DISTILLED}); "
                              "give parallel.base=DIR.")
        if p.get("update", "low_rank") not in UPDATES:
            raise ConfigError(f"parallel.update={p.update}; use low_rank (a rank-r update of parallel.modules) or "
                              "full (every weight of the draft trained, PARD's recipe).")
        if self.update == "low_rank" and not p.modules:
            raise ConfigError("parallel.modules is empty; name the linear layers to adapt, e.g. [q_proj, v_proj].")

    def base(self, cfg: DictConfig) -> Path:
        return Path(cfg.parallel.base).expanduser() if cfg.parallel.base else SHIPPED_DISTILLED

    def make(self, cfg: DictConfig, target: Target, train: TeacherData) -> ParallelStudent:
        p = cfg.parallel
        base, _ = student_from_pretrained(self.base(cfg), target.model)
        if base.embed[0] is None:
            raise ConfigError(f"parallel.base={self.base(cfg)}: a parallel draft starts from a distilled draft "
                              "that reads the target's embeddings (`spec-zoo-train distill`).")
        if self.update == "full":
            self.start = {name: w.detach().float().clone() for name, w in base.lm.named_parameters()}
        elif add_low_rank(base.lm, int(p.rank), float(p.alpha) / int(p.rank), list(p.modules)) == 0:
            raise ConfigError(f"parallel.modules={list(p.modules)}: no such linear layer in the draft's decoder "
                              "layers (Llama names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).")
        table = target.model.get_input_embeddings().weight.detach().float()
        masks = table.mean(0).repeat(int(p.k) - 1, 1)  # the average token: a neutral start for every mask
        return ParallelStudent(base, masks)

    def preload(self, student: Student, data: TeacherData, teacher: TeacherSet, cfg: DictConfig) -> None:
        """Nothing: a draft model reads tokens only."""

    def trainable(self, student: Student, cfg: DictConfig) -> list[torch.nn.Parameter]:
        if self.update == "full":
            params = list(student.lm.parameters())  # the masks and every weight of the draft
            for p in params:
                p.requires_grad_(True)
            return params
        for p in student.lm.parameters():
            p.requires_grad_(False)
        params = [getattr(student.lm, MASKS)]
        params += [p for m in student.lm.modules() if isinstance(m, LowRank) for p in (m.down, m.up)]
        for p in params:
            p.requires_grad_(True)
        return params

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        """Per teacher position j: ``loss`` = the sum over offsets i < k of decay^i x the ``kind``
        divergence of row i after anchor j from the target at j + i; with agreement, per offset greedy
        agreement (``pos<i>_greedy``) and 1 - TV (``pos<i>_sampled``), and ``tau_chain`` (1 + the
        leading offsets that are right: a greedy chain of k's tokens per step)."""
        assert isinstance(student, ParallelStudent)
        ids, mask, where, t_ids, t_index, t_logp = teacher_positions(student, data, rows, full_vocab)
        states = student.anchored(ids, mask, where)
        device, k = where.device, student.k
        metrics = AheadMetrics(data, rows, k, "pos", with_agreement, device)
        for i in range(k):
            src, dst = metrics.rows(i)  # the teacher row of the token i places after the anchor's next one
            logits = student.head(states[src, i])
            loss = self.decay ** i * divergence(logits, t_index[dst], t_logp[dst], kind)
            metrics.add(i, src, loss, logits, student.vocab_ids, t_ids, t_index, t_logp, dst)
        return metrics.result()

    def extra_loss(self, student: Student, cfg: DictConfig) -> torch.Tensor | None:
        return None

    def save(self, student: Student, cfg: DictConfig, target_info: dict, record: dict) -> Path:
        p, base = cfg.parallel, self.base(cfg)
        info = {"path": str(p.base) if p.base else None, "sha256": weights_digest(base), "update": self.update,
                **({"modules": list(p.modules), "alpha": float(p.alpha)} if self.update == "low_rank" else {})}
        with torch.no_grad():
            updates = low_rank_updates(student.lm) if self.update == "low_rank" else {}
            dense = full_updates(student.lm, self.start)  # start: the base's weights, taken before the masks joined
            return save_parallel(Path(cfg.output.dir).expanduser(), getattr(student.lm, MASKS),
                                 updates, {"target": target_info, "base": info, **record}, dense=dense,
                                 dtype=DTYPES[str(cfg.output.dtype)],
                                 quantize=cfg.output.get("quantize", DEFAULT_QUANTIZE),
                                 overwrite=bool(cfg.output.get("overwrite", False)))

    def load(self, path: Path, model: torch.nn.Module) -> Student:
        record, tensors = read_parallel(path, "report.artefacts")
        base, _ = student_from_pretrained(base_dir(record, SHIPPED_DISTILLED, path, "report.artefacts"), model)
        apply_updates(base.lm, tensors, "report.artefacts", path)
        return ParallelStudent(base, tensors[MASKS]).eval()

    def depth_matches(self, student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                      t_ids: torch.Tensor, local: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """The depth-s draft of a token is row s - 1 after the anchor s - 1 places before it (the
        same continuation when ``local >= s - 1``); none past k."""
        assert isinstance(student, ParallelStudent)
        states = student.anchored(ids, mask, where)
        cols = []
        for s in range(1, depth + 1):
            col = torch.zeros(len(where), dtype=torch.bool, device=where.device)
            if s <= student.k:
                ok = (local >= s - 1).nonzero()[:, 0]
                col[ok] = right_at(student.head(states[ok - (s - 1), s - 1]), student.vocab_ids, t_ids[ok])
            cols.append(col)
        return cols
