"""The generic training pipeline every recipe plugs into (``spec-zoo-train <recipe>``):

1. load the target; draw and encode training prompts from the mixture (`spec_zoo.train.mixture`);
2. teacher data: the target's continuations of the prompts + its top-k next-token
   distributions at every generated position, and the target states a head reads
   (batched, from the shared, resumable store `spec_zoo.train.store`);
3. build the module the recipe trains (``recipe.make``): a draft model, an exit adapter,
   an EAGLE head, ...;
4. train it on the loss of ``cfg.loss`` (fkl / rkl / tvd), with a progress bar showing the
   loss and the held-out acceptance, periodic checkpoints and resume;
5. write the artefact (``recipe.save``).

A recipe (``drafters/<method>/train.py``) supplies ``desc``, ``check``, ``make``,
``trainable``, ``save`` and optionally ``extra_loss``, or ``batch_metrics`` for a loss of its
own (several heads: `spec_zoo.drafters.medusa.train`); a module it makes exposes
``hidden``, ``head``, ``vocab_ids`` and ``lm`` (see `spec_zoo.drafters.distilled.student.Student`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from spec_zoo.errors import ConfigError
from spec_zoo.train.data import TeacherData, concat_data, data_key, forced_data, read_records, student_data
from spec_zoo.train.losses import LOSSES, agreement, divergence
from spec_zoo.train.store import TeacherSet


def check_config(cfg: DictConfig, recipe) -> None:
    """Cheap checks, before any model loads; each message names the key."""
    if cfg.loss not in LOSSES:
        raise ConfigError(f"loss={cfg.loss!r}; allowed values: {', '.join(LOSSES)}.")
    recipe.check(cfg)
    if int(cfg.train.steps) < 0:
        raise ConfigError(f"train.steps={cfg.train.steps}; use 0 (teacher data only) or more steps.")
    for key in ("train.batch_size", "data.batch_size", "data.max_new_tokens", "data.max_prompt_tokens"):
        if int(OmegaConf.select(cfg, key)) < 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)}; it must be a positive integer.")
    if int(cfg.data.get("forced_prompts", 0)) < 0:
        raise ConfigError(f"data.forced_prompts={cfg.data.forced_prompts}; use 0 or more prompts.")
    if not 0.0 <= float(cfg.data.get("student_fraction", 0.0)) <= 1.0:
        raise ConfigError(f"data.student_fraction={cfg.data.student_fraction}; use a fraction in [0, 1].")
    if not 0.0 <= float(cfg.data.heldout) < 1.0:
        raise ConfigError(f"data.heldout={cfg.data.heldout}; use a fraction in [0, 1).")
    from spec_zoo.artefacts import check_out_dir

    record_name, fmt = recipe.artefact
    check_out_dir(cfg.output.dir, record_name, fmt, "output.dir", bool(cfg.output.get("overwrite", False)))
    if cfg.data.get("prompts") and cfg.data.get("token_ids") is None:
        read_records(cfg.data.prompts)  # a missing, non-UTF-8 or malformed file fails here, before the target loads
    if cfg.output.dtype not in ("float32", "float16", "bfloat16"):
        raise ConfigError(f"output.dtype={cfg.output.dtype!r}; allowed values: float32, float16, bfloat16.")
    from spec_zoo.models import DEVICES

    device = str(cfg.get("device", "cpu"))
    if device not in DEVICES:
        raise ConfigError(f"device={device!r}; allowed values: {', '.join(DEVICES)} (auto: cuda when available).")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but CUDA is not available here; use device=cpu or device=auto.")


def load_teacher_target(cfg: DictConfig):
    """The target of ``cfg.target`` on ``cfg.device``."""
    from spec_zoo.models import load_target, resolve_device

    t = cfg.target
    return load_target(name=t.name, path=t.path, dtype=t.dtype, device=resolve_device(str(cfg.get("device", "cpu"))))


def _device(student) -> torch.device:
    return next(student.lm.parameters()).device


def teacher_positions(student, data: TeacherData, rows: torch.Tensor, full_vocab: int):
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


def batch_metrics(student, data: TeacherData, rows, full_vocab: int, kind: str, with_agreement=False) -> dict:
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


@torch.no_grad()
def evaluate(student, data: TeacherData, full_vocab: int, kind: str, batch_size: int = 16,
             metrics=batch_metrics) -> dict:
    """Held-out means of what ``metrics`` returns per position (by default loss, greedy and
    sampled acceptance; a recipe's ``batch_metrics`` may return more)."""
    if len(data) == 0:
        return {"loss": float("nan"), "alpha_greedy": float("nan"), "alpha_sampled": float("nan")}
    student.eval()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s in range(0, len(data), batch_size):
        rows = torch.arange(s, min(s + batch_size, len(data)))
        for name, values in metrics(student, data, rows, full_vocab, kind, with_agreement=True).items():
            sums[name] = sums.get(name, 0.0) + float(values.float().sum())
            counts[name] = counts.get(name, 0) + values.numel()
    return {k: round(v / max(counts[k], 1), 4) for k, v in sums.items()}


def select_vocab(counts: torch.Tensor, size: int, always=()) -> torch.Tensor | None:
    """The ``size`` most frequent token ids (plus ``always``), sorted; None = full vocabulary."""
    V = counts.shape[0]
    if size <= 0 or size >= V:
        return None
    always = sorted({int(t) for t in always if 0 <= int(t) < V})
    scores = counts.clone().double()
    scores[always] = float("inf")
    # ties (e.g. unseen tokens) broken by id, deterministically
    order = sorted(range(V), key=lambda i: (-scores[i].item(), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def draft_vocab(target, train: TeacherData, size: int) -> torch.Tensor | None:
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


def _lr(step: int, cfg: DictConfig, steps: int) -> float:
    t = cfg.train
    warm = int(t.warmup)
    if step < warm:
        return float(t.lr) * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    floor = float(t.min_lr_ratio)
    return float(t.lr) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _save_checkpoint(path: Path, student, opt, step: int, gen: torch.Generator, history: list) -> None:
    state = {
        "step": step,
        "model": {k: v for k, v in student.lm.state_dict().items()},
        "optimizer": opt.state_dict(),
        "generator": gen.get_state(),
        "vocab_ids": student.vocab_ids,
        "history": json.dumps(history),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, student, opt, gen: torch.Generator) -> tuple[int, list]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"checkpoint {path} is corrupt ({type(e).__name__}); "
                          "delete it or set train.resume=false.") from None
    saved_vocab = state.get("vocab_ids")
    if (saved_vocab is None) != (student.vocab_ids is None) or (
        saved_vocab is not None and not torch.equal(saved_vocab, student.vocab_ids)
    ):
        raise ConfigError(f"checkpoint {path} was made with another draft vocabulary / data; "
                          "delete it or set train.resume=false (or use another output.dir).")
    try:
        student.lm.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(f"checkpoint {path} does not match the student of this config ({str(e)[:160]}); "
                          "delete it or set train.resume=false.") from None
    gen.set_state(state["generator"])
    return int(state["step"]), json.loads(state.get("history", "[]"))


def train_module(cfg: DictConfig, recipe, target=None) -> Path:
    """The pipeline (data, training loop, artefact) for the module ``recipe`` builds."""
    from tqdm import tqdm

    check_config(cfg, recipe)
    t0 = time.time()
    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.train.seed))
    out_dir = Path(cfg.output.dir).expanduser()
    if target is None:
        target = load_teacher_target(cfg)
    model = target.model

    # -- data ---------------------------------------------------------------------
    d = cfg.data
    n_forced = int(d.get("forced_prompts", 0))
    t_data = time.time()
    teacher = TeacherSet(cfg, target, int(d.num_prompts) + n_forced)
    # the last n_forced are read, not continued
    prompt_ids, n_prompts = teacher.prompts, len(teacher.prompts) - n_forced
    forced_ids = prompt_ids[n_prompts:] if n_forced else []
    if n_prompts < 2:
        raise ConfigError(f"only {n_prompts} usable prompts; raise data.num_prompts or data.max_prompt_tokens.")
    target_info, settings = teacher.identity["target"], {**teacher.identity, "sequences": n_prompts}
    data = teacher.fill(n_prompts, bool(cfg.progress))
    data_s = time.time() - t_data
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(int(d.seed)))
    n_held = round(len(data) * float(d.heldout))
    held, train = data.subset(order[:n_held]), data.subset(order[n_held:])
    forced_positions, continued = 0, len(train)  # train rows continued by the target (before forced ones)
    if forced_ids:  # cheap extra positions: text the target reads (one forward each) instead of writes;
        # training only: the held-out metrics stay on text the target writes, as at decode time
        t_forced = time.time()
        key = data_key({**settings, "forced": forced_ids, "skip": "shared_prefix"})
        forced = forced_data(model, forced_ids, cache_dir=d.cache_dir, key=key, top_k=int(d.top_k),
                             batch_size=int(d.batch_size), progress=bool(cfg.progress))
        train, forced_positions = concat_data(train, forced), forced.positions
        data_s += time.time() - t_forced

    # -- student ------------------------------------------------------------------
    student = recipe.make(cfg, target, train)
    student.lm.to(model.device)
    if hasattr(student, "states_name"):  # a head reading target states: from the store (computed once per shard)
        t_states = time.time()
        student.preload(data, teacher.store.states(student.states_name, student.target_states, int(d.batch_size),
                                                   bool(cfg.progress)))
        data_s += time.time() - t_states
    if int(cfg.train.steps) == 0:  # teacher data (and the states the module reads) only: train later, elsewhere
        print(f"teacher data ready in {teacher.store.root} ({data_s:.0f}s); train.steps=0: nothing trained",
              file=sys.stderr)
        return teacher.store.root
    full_vocab = target.vocab_size
    n_student = round(continued * float(d.get("student_fraction", 0.0)))
    if n_student:  # on-policy for the student too: its own continuations, scored by the target
        t_student = time.time()
        prompts = [train.ids[i, : int(train.prompt_len[i])].tolist() for i in range(n_student)]
        vocab = None if student.vocab_ids is None else student.vocab_ids.tolist()
        skey = data_key({**settings, "student": OmegaConf.to_container(cfg.student), "vocab": vocab, "n": n_student})
        extra = student_data(student, model, prompts, cache_dir=d.cache_dir, key=skey,
                             max_new_tokens=int(d.max_new_tokens), top_k=int(d.top_k),
                             temperature=float(d.temperature), batch_size=int(d.batch_size), eos_ids=teacher.eos_ids,
                             pad_id=teacher.pad_id, seed=int(d.seed), progress=bool(cfg.progress))
        train = concat_data(train, extra)
        data_s += time.time() - t_student
    kind = str(cfg.loss)
    metrics = getattr(recipe, "batch_metrics", batch_metrics)
    before = evaluate(student, held, full_vocab, kind, metrics=metrics)
    params = recipe.trainable(student, cfg)
    opt = torch.optim.AdamW(params, lr=float(cfg.train.lr), weight_decay=float(cfg.train.weight_decay))
    gen = torch.Generator().manual_seed(int(cfg.train.seed))
    ckpt_dir = out_dir.parent / f".{out_dir.name}.checkpoints"
    ckpt = ckpt_dir / "last.pt"
    step = 0
    history: list = []
    if bool(cfg.train.resume) and ckpt.is_file():
        step, history = _load_checkpoint(ckpt, student, opt, gen)
        print(f"resumed from {ckpt} at step {step}", file=sys.stderr)
    steps, bs = int(cfg.train.steps), int(cfg.train.batch_size)
    max_s, mark, timed = float(cfg.train.get("max_seconds", 0) or 0), step + 5, step + 25  # timed after a warm-up
    last_eval = history[-1]["alpha_greedy"] if history else before["alpha_greedy"]
    t_train = t_mark = time.time()
    bar = tqdm(total=steps, initial=step, desc=f"{recipe.desc} ({kind})", disable=not cfg.progress, dynamic_ncols=True)
    ema = None
    while step < steps:
        student.lm.train()
        rows = torch.randint(0, len(train), (bs,), generator=gen)
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg, steps)
        loss = metrics(student, train, rows, full_vocab, kind)["loss"].mean()
        if hasattr(recipe, "extra_loss"):  # a recipe's own term next to the distillation loss
            loss = loss + recipe.extra_loss(student, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if float(cfg.train.grad_clip) > 0:
            torch.nn.utils.clip_grad_norm_(params, float(cfg.train.grad_clip))
        opt.step()
        step += 1
        value = float(loss.detach())
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        if step % int(cfg.train.eval_every) == 0 or step == steps:
            heldout = evaluate(student, held, full_vocab, kind, metrics=metrics)
            history.append({"step": step, "train_loss": round(ema, 4), **heldout})
            last_eval = heldout["alpha_greedy"]
        if step % int(cfg.train.ckpt_every) == 0 and step < steps:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            _save_checkpoint(ckpt, student, opt, step, gen, history)
        if step == mark:
            t_mark = time.time()
        if max_s and step == timed:  # a wall-time budget: as many steps as fit, on a schedule that ends there
            fit = step + int((max_s - (time.time() - t_train)) / ((time.time() - t_mark) / (timed - mark)))
            if fit < steps:
                steps = max(step, fit)
                bar.total = steps
                print(f"train.max_seconds={max_s:g}: {steps} steps fit (of train.steps={cfg.train.steps})",
                      file=sys.stderr)
        bar.set_postfix(loss=f"{ema:.4f}", heldout_alpha=f"{last_eval:.3f}")
        bar.update(1)
    bar.close()
    train_s = time.time() - t_train
    after = evaluate(student, held, full_vocab, kind, metrics=metrics)
    record = {
        "data": {"prompts": str(d.prompts or "spec_zoo/train/data/prompts.jsonl"), "store": str(teacher.store.root),
                 "mixture": teacher.taken, "sequences": len(data) + len(forced_ids),
                 "train_sequences": len(train), "heldout_sequences": len(held),
                 "positions": data.positions + forced_positions,
                 "student_sequences": n_student, "forced_prompts": int(d.get("forced_prompts", 0)),
                 "max_new_tokens": int(d.max_new_tokens), "top_k": int(d.top_k), "temperature": float(d.temperature),
                 "chat": bool(d.chat)},
        "loss": kind,
        "steps": step,
        "batch_size": bs,
        "heldout_before": before,
        "heldout_after": after,
        "history": history,
        "time_s": {"data": round(data_s, 1), "train": round(train_s, 1), "total": round(time.time() - t0, 1)},
        "threads": int(cfg.threads),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    student.lm.to("cpu")  # artefacts are written from (and load to) the CPU
    path = recipe.save(student, cfg, target_info, record)
    if ckpt.is_file() and not bool(cfg.train.keep_checkpoints):
        ckpt.unlink()
        try:
            ckpt_dir.rmdir()
        except OSError:
            pass
    print(f"held-out alpha (greedy) {before['alpha_greedy']:.3f} -> {after['alpha_greedy']:.3f}; "
          f"1-TV {before['alpha_sampled']:.3f} -> {after['alpha_sampled']:.3f}; "
          f"data {data_s:.0f}s, train {train_s:.0f}s; saved {path}", file=sys.stderr)
    return path
