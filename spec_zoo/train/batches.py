"""What a batch of teacher data gives a student: the teacher's targets at each generated
position (`teacher_positions`), the per-position loss and acceptance of a batch
(`batch_metrics`), their held-out means (`evaluate`), and the draft vocabulary chosen from
the training data (`draft_vocab`). Shared by the pipeline (`spec_zoo.train.loop`), the
recipes and `spec-zoo-train report`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from spec_zoo.train.data import TeacherData
from spec_zoo.train.losses import agreement, divergence
from spec_zoo.train.recipe import Student

Metrics = Callable[..., dict[str, torch.Tensor]]  # a recipe's batch_metrics (the signature of `batch_metrics`)


def _device(student: Student) -> torch.device:
    return next(student.lm.parameters()).device


def teacher_positions(student: Student, data: TeacherData, rows: torch.Tensor,
                      full_vocab: int) -> tuple[torch.Tensor, ...]:
    """Teacher targets of a batch of sequences (teacher data stays on the CPU; these move to
    the student's device): (ids, mask, flat hidden-state index, t_ids, t_index, t_logp)."""
    lut = None
    if student.vocab_ids is not None:
        lut = torch.full((full_vocab,), -1, dtype=torch.long)
        lut[student.vocab_ids.cpu()] = torch.arange(student.vocab_ids.numel())
    ids = data.ids[rows]
    L = int((data.prompt_len[rows] + data.gen_len[rows]).max())
    ids = ids[:, :L]
    mask = (ids >= 0).long()
    where, id_rows, logp_rows = [], [], []
    for b, i in enumerate(rows.tolist()):
        p, g = int(data.prompt_len[i]), int(data.gen_len[i])
        # the hidden state at position p - 1 + t predicts token p + t
        where.append(b * L + torch.arange(p - 1, p - 1 + g))
        id_rows.append(data.topk_ids[i, :g])
        logp_rows.append(data.topk_logp[i, :g])
    t_ids, t_logp = torch.cat(id_rows), torch.cat(logp_rows)
    t_index = t_ids if lut is None else lut[t_ids]
    device = _device(student)
    return tuple(t.to(device) for t in (ids.clamp(min=0), mask, torch.cat(where), t_ids, t_index, t_logp))


def batch_metrics(student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                  with_agreement: bool = False) -> dict[str, torch.Tensor]:
    """Per-position values of a batch: ``loss`` (what trains), and with ``with_agreement``
    ``alpha_greedy`` (draft argmax == target argmax) and ``alpha_sampled`` (1 - TV at temperature 1)."""
    ids, mask, where, t_ids, t_index, t_logp = teacher_positions(student, data, rows, full_vocab)
    hidden = student.hidden(ids, mask)
    logits = student.head(hidden.reshape(-1, hidden.shape[-1])[where])
    loss = divergence(logits, t_index, t_logp, kind)
    if with_agreement:
        greedy, accept = agreement(logits, student.vocab_ids, t_ids, t_index, t_logp)
        return {"loss": loss, "alpha_greedy": greedy, "alpha_sampled": accept}
    return {"loss": loss}


class TeacherMetrics:
    """What most recipes share: a batch scored by `batch_metrics` (the student's next-token
    logits against the teacher's) and no loss term of their own."""

    def batch_metrics(self, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int, kind: str,
                      with_agreement: bool = False) -> dict[str, torch.Tensor]:
        return batch_metrics(student, data, rows, full_vocab, kind, with_agreement)

    def extra_loss(self, student: Student, cfg: Any) -> torch.Tensor | None:
        return None


def draft_index(tokens: torch.Tensor, vocab_ids: torch.Tensor | None, full_vocab: int) -> torch.Tensor:
    """Target ids -> places in the draft vocabulary (-1: outside it, not learnable)."""
    if vocab_ids is None:
        return tokens
    lut = torch.full((full_vocab,), -1, dtype=torch.long, device=tokens.device)
    lut[vocab_ids.to(tokens.device)] = torch.arange(vocab_ids.numel(), device=tokens.device)
    return lut[tokens]


class AheadMetrics:
    """The batch metrics of a recipe that guesses tokens several places ahead of each teacher
    position (Medusa heads, staged heads, parallel masks), added up guess by guess: ``loss`` =
    the sum of decay^i x guess i's loss (guesses past a sequence's end left out); with
    agreement, per guess ``<name><i>_greedy`` and ``<name><i>_sampled`` (1 - TV), ``alpha_*``
    of the first, and ``tau_chain`` (1 + the leading guesses that are right, over the rows
    every guess has a token for: tokens per step of a greedy chain of them all)."""

    def __init__(self, data: TeacherData, rows: torch.Tensor, guesses: int, name: str, with_agreement: bool,
                 device: torch.device):
        gen = data.gen_len[rows].tolist()
        self.t = torch.cat([torch.arange(g) for g in gen]).to(device)  # each row's place in its continuation
        self.end = torch.cat([torch.full((g,), g) for g in gen]).to(device)
        self.name, self.with_agreement, self.furthest = name, with_agreement, 0
        self.loss = torch.zeros(len(self.t), device=device)
        self.matched = torch.zeros(len(self.t), guesses, dtype=torch.bool, device=device)
        self.out: dict[str, torch.Tensor] = {}

    def rows(self, ahead: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows with a token ``ahead`` teacher rows further on in their sequence, those rows)."""
        self.furthest = max(self.furthest, ahead)
        src = (self.t + ahead < self.end).nonzero()[:, 0]
        return src, src + ahead  # rows are consecutive within a sequence

    def add(self, i: int, src: torch.Tensor, weighted_loss: torch.Tensor, logits: torch.Tensor,
            vocab_ids: torch.Tensor | None, t_ids: torch.Tensor, t_index: torch.Tensor, t_logp: torch.Tensor,
            dst: torch.Tensor) -> None:
        """Guess ``i`` at rows ``src`` (its teacher rows ``dst``): its decayed loss and agreement."""
        self.loss = self.loss.index_add(0, src, weighted_loss)
        if self.with_agreement:
            greedy, accept = agreement(logits, vocab_ids, t_ids[dst], t_index[dst], t_logp[dst])
            self.out[f"{self.name}{i + 1}_greedy"], self.out[f"{self.name}{i + 1}_sampled"] = greedy, accept
            self.matched[src, i] = greedy

    def result(self) -> dict[str, torch.Tensor]:
        out = {**self.out, "loss": self.loss}
        if self.with_agreement:
            out["alpha_greedy"], out["alpha_sampled"] = out[f"{self.name}1_greedy"], out[f"{self.name}1_sampled"]
            full = self.t + self.furthest < self.end
            out["tau_chain"] = 1 + self.matched[full].long().cumprod(1).sum(1)
        return out


@torch.no_grad()
def evaluate(student: Student, data: TeacherData, full_vocab: int, kind: str, batch_size: int = 16,
             metrics: Metrics = batch_metrics) -> dict[str, float]:
    """Held-out means of what ``metrics`` returns per position (by default loss, greedy and
    sampled acceptance; a recipe's ``batch_metrics`` may return more)."""
    if len(data) == 0:
        return {"loss": float("nan"), "alpha_greedy": float("nan"), "alpha_sampled": float("nan")}
    student.eval()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    order = torch.sort(data.prompt_len + data.gen_len, stable=True).indices  # like lengths together: less padding
    for s in range(0, len(data), batch_size):
        rows = order[s : s + batch_size]
        for name, values in metrics(student, data, rows, full_vocab, kind, with_agreement=True).items():
            sums[name] = sums.get(name, 0.0) + float(values.float().sum())
            counts[name] = counts.get(name, 0) + values.numel()
    return {k: round(v / max(counts[k], 1), 4) for k, v in sums.items()}


def select_vocab(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor | None:
    """The ``size`` most frequent token ids (plus ``always``), sorted; None = full vocabulary."""
    V = counts.shape[0]
    if size <= 0 or size >= V:
        return None
    kept = sorted({int(t) for t in always if 0 <= int(t) < V})
    scores = counts.clone().double()
    scores[kept] = float("inf")
    # ties (e.g. unseen tokens) broken by id, deterministically
    order = sorted(range(V), key=lambda i: (-scores[i].item(), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def draft_vocab(target: Any, train: TeacherData, size: int) -> torch.Tensor | None:
    """The ``size`` most frequent tokens of the training data, plus special and EOS ids
    (None: the full vocabulary)."""
    if size <= 0:
        return None
    tok = target.tokenizer
    always = list(getattr(tok, "all_special_ids", []) or []) if tok is not None else []
    gen_cfg = getattr(target.model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    always += eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    return select_vocab(train.token_counts(target.vocab_size), size, always)


def right_at(logits: torch.Tensor, vocab: torch.Tensor | None, t_ids: torch.Tensor) -> torch.Tensor:
    """The draft's argmax (in target ids) is the target's argmax."""
    top = logits.argmax(-1)
    return (top if vocab is None else vocab[top]) == t_ids[:, 0]


def same_at_every_depth(student: Student, ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor,
                        t_ids: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """`Recipe.depth_matches` of a draft that reads tokens only (a draft model, an exit
    adapter): its depth-s draft of a token, teacher-forced, is its depth-1 draft."""
    hidden = student.hidden(ids, mask)
    return [right_at(student.head(hidden.reshape(-1, hidden.shape[-1])[where]), student.vocab_ids, t_ids)] * depth
