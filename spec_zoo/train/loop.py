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

Each step is a function of its own (`teacher_split`, `student_for`, `add_student_data`,
`train_student`, `write_artefact`); what a method brings is its `spec_zoo.train.recipe.Recipe`
(``drafters/<method>/train.py``), the student it makes a `spec_zoo.train.recipe.Student`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import safe_open
from safetensors.torch import save_file

from spec_zoo.artefacts import check_quantize
from spec_zoo.errors import ConfigError
from spec_zoo.outputs import atomic_write, resolved
from spec_zoo.runtime.target import Target
from spec_zoo.train.batches import evaluate
from spec_zoo.train.data import TeacherData, concat_data, data_key, forced_data, read_records, student_data
from spec_zoo.train.losses import LOSSES
from spec_zoo.train.mixture import FollowUp
from spec_zoo.train.recipe import Recipe, Student
from spec_zoo.train.store import TeacherSet, data_budget, state_layers


def check_config(cfg: DictConfig, recipe: Recipe) -> None:
    """Cheap checks, before any model loads; each message names the key."""
    if cfg.loss not in LOSSES:
        raise ConfigError(f"loss={cfg.loss!r}; allowed values: {', '.join(LOSSES)}.")
    recipe.check(cfg)
    if int(cfg.train.steps) < 0:
        raise ConfigError(f"train.steps={cfg.train.steps}; use 0 (teacher data only) or more steps.")
    for key in ("train.batch_size", "data.batch_size", "data.max_new_tokens", "data.max_prompt_tokens"):
        if int(OmegaConf.select(cfg, key)) < 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)}; it must be a positive integer.")
    if float(cfg.train.get("budget_s", 0) or 0) and (float(cfg.train.get("max_seconds", 0) or 0)
                                                   or int(cfg.train.get("patience", 0) or 0)):
        raise ConfigError("train.budget_s (checkpoint and stop, resume later) with train.max_seconds or "
                          "train.patience: their step estimate and best weights are not checkpointed, so a resumed "
                          "run would differ; "
                          "set train.max_seconds=0 train.patience=0, or train.budget_s=0.")
    data_budget(cfg.data)
    for name in cfg.data.get("keep_states") or ():
        state_layers(str(name))
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
    for key in ("quantize", "quantize_head"):
        check_quantize(cfg.output.get(key), f"output.{key}")
    from spec_zoo.models import DEVICES

    device = str(cfg.get("device", "cpu"))
    if device not in DEVICES:
        raise ConfigError(f"device={device!r}; allowed values: {', '.join(DEVICES)} (auto: cuda when available).")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but CUDA is not available here; use device=cpu or device=auto.")


def compute_dtype(cfg: DictConfig, device: torch.device) -> torch.dtype:
    """``train.dtype``: bfloat16 runs the forward/backward under autocast (the matrix engine's
    dtype; the weights and the optimizer stay float32); auto takes it where the hardware has a
    bf16 unit (CPU: AMX or AVX512-BF16, `spec_zoo.runtime.cpp_kernels.host_isa`), since elsewhere bf16 is emulated."""
    want = str(cfg.train.get("dtype", "float32"))
    if want == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        from spec_zoo.runtime.cpp_kernels import host_isa

        return torch.bfloat16 if host_isa() in ("amx", "avx512-bf16") else torch.float32
    return torch.bfloat16 if want == "bfloat16" else torch.float32


def load_teacher_target(cfg: DictConfig) -> Target:
    """The target of ``cfg.target`` on ``cfg.device``."""
    from spec_zoo.models import load_target, resolve_device

    t = cfg.target
    return load_target(name=t.name, path=t.path, dtype=t.dtype, device=resolve_device(str(cfg.get("device", "cpu"))),
                       key="target")


def _lr(step: int, cfg: DictConfig, steps: int) -> float:
    t = cfg.train
    warm = int(t.warmup)
    if step < warm:
        return float(t.lr) * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    floor = float(t.min_lr_ratio)
    return float(t.lr) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# keys that leave a run's result as it is: a resume may change them (every other key must stay)
_RESUMABLE = ("train.resume", "train.budget_s", "train.keep_checkpoints", "train.ckpt_every", "progress",
              "output.dir", "output.overwrite", "data.cache_dir", "data.budget_s", "data.keep_states")


def _result_config(cfg: DictConfig, dtype: torch.dtype) -> dict[str, str]:
    """The config as flat ``key -> value`` (JSON), less `_RESUMABLE`, with ``train.dtype`` as resolved
    (auto differs between hosts): what a checkpoint's run depended on."""
    flat: dict[str, str] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif prefix[:-1] not in _RESUMABLE:
            flat[prefix[:-1]] = json.dumps(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat | {"train.dtype": json.dumps(str(dtype).removeprefix("torch."))}


def _check_same_config(path: Path, saved: dict[str, str], now: dict[str, str]) -> None:
    """A resume continues the checkpoint's run only under its config; anything else is refused, naming the keys."""
    diff = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if diff:
        shown = "; ".join(f"{k}={saved.get(k, '(unset)')} there, {now.get(k, '(unset)')} here" for k in diff[:4])
        raise ConfigError(f"checkpoint {path} was made with another config ({shown}"
                          f"{'; ...' if len(diff) > 4 else ''}): resuming would not give the run it started; "
                          "rerun with the checkpoint's values, or set train.resume=false (or another output.dir) "
                          "to start over.")


def _save_checkpoint(path: Path, student: Student, opt: torch.optim.Optimizer, step: int, gen: torch.Generator,
                     history: list, ema: float | None, run: dict[str, str], seconds: float) -> None:
    """The run so far as one safetensors file (never a pickle): the student's weights, the
    optimizer's per-parameter tensors and the generator's state as tensors; the step, the
    config, the loss average (a resumed run writes the same history), the training seconds
    spent so far (a run in stretches records its whole cost) and the optimizer's param groups
    as JSON metadata."""
    opt_state = opt.state_dict()
    tensors = {f"model.{k}": v for k, v in student.lm.state_dict().items()}
    tensors |= {f"optimizer.{i}.{name}": t for i, each in opt_state["state"].items() for name, t in each.items()}
    tensors["generator"] = gen.get_state()
    if student.vocab_ids is not None:
        tensors["vocab_ids"] = student.vocab_ids
    metadata = {"format": "spec-zoo-train-checkpoint", "step": str(step), "config": json.dumps(run),
                "ema": json.dumps(ema), "history": json.dumps(history), "seconds": json.dumps(round(seconds, 3)),
                "param_groups": json.dumps(opt_state["param_groups"])}
    # cloned: tied weights share storage, which safetensors refuses to write twice
    atomic_write(path, lambda tmp: save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()},
                                             tmp, metadata=metadata))


def _read_checkpoint(path: Path) -> dict:
    """What `_save_checkpoint` wrote, as the dict it was made from."""
    with safe_open(path, "pt") as f:
        meta, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = t
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
              for g in json.loads(meta["param_groups"])]  # JSON made betas a list
    return {"step": int(meta["step"]), "config": meta["config"], "ema": json.loads(meta["ema"]),
            "seconds": json.loads(meta.get("seconds", "0")),
            "history": meta["history"], "generator": tensors["generator"], "vocab_ids": tensors.get("vocab_ids"),
            "model": {k.removeprefix("model."): t for k, t in tensors.items() if k.startswith("model.")},
            "optimizer": {"state": state, "param_groups": groups}}


def _load_checkpoint(path: Path, student: Student, opt: torch.optim.Optimizer,
                     gen: torch.Generator, run: dict[str, str]) -> tuple[int, list, float | None, float]:
    try:
        state = _read_checkpoint(path)
    except Exception as e:
        raise ConfigError(f"checkpoint {path} is corrupt or not a spec-zoo checkpoint ({type(e).__name__}); "
                          "delete it or set train.resume=false.") from None
    _check_same_config(path, json.loads(state.get("config", "{}")), run)
    saved_vocab, vocab = state.get("vocab_ids"), student.vocab_ids
    if not ((saved_vocab is None and vocab is None)
            or (saved_vocab is not None and vocab is not None and torch.equal(saved_vocab, vocab))):
        raise ConfigError(f"checkpoint {path} was made with another draft vocabulary / data; "
                          "delete it or set train.resume=false (or use another output.dir).")
    try:
        student.lm.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(f"checkpoint {path} does not match the student of this config ({str(e)[:160]}); "
                          "delete it or set train.resume=false.") from None
    gen.set_state(state["generator"])
    return int(state["step"]), json.loads(state.get("history", "[]")), state.get("ema"), float(state["seconds"])


@dataclass
class TeacherSplit:
    """The teacher data of a run: ``train`` (continued sequences, then forced and student
    ones as they are added) and ``held`` (held-out continued sequences, what the metrics
    read), and what the record says about them."""

    teacher: TeacherSet
    data: TeacherData  # every continued sequence
    train: TeacherData
    held: TeacherData
    settings: dict
    continued: int  # train rows continued by the target (before forced and student ones)
    forced_prompts: int = 0
    forced_positions: int = 0
    student_sequences: int = 0
    seconds: float = 0.0  # time spent on teacher data (and the states the student reads)


@dataclass
class Fit:
    """What the training loop did: steps run, held-out metrics before and after, the history
    of evaluations, its time (every stretch's, for a resumed run), and where its checkpoint lives."""

    steps: int
    before: dict[str, float]
    after: dict[str, float]
    history: list[dict]
    seconds: float
    checkpoint: Path
    paused: bool = False  # train.budget_s ran out: checkpointed, to be resumed


def train_module(cfg: DictConfig, recipe: Recipe, target: Target | None = None) -> Path:
    """The pipeline (data, training loop, artefact) for the module ``recipe`` builds; returns
    the artefact dir (the teacher-data store with ``train.steps=0``)."""
    check_config(cfg, recipe)
    t0 = time.time()
    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.train.seed))
    if target is None:
        target = load_teacher_target(cfg)
    split = teacher_split(cfg, target)
    student = student_for(cfg, recipe, target, split)
    if int(cfg.train.steps) == 0:  # teacher data (and the states the module reads) only: train later, elsewhere
        print(f"teacher data ready in {split.teacher.store.root} ({split.seconds:.0f}s); "
              "train.steps=0: nothing trained", file=sys.stderr)
        return split.teacher.store.root
    add_student_data(cfg, student, target, split)
    fit = train_student(cfg, recipe, student, split, target.vocab_size)
    if fit.paused:
        return fit.checkpoint
    return write_artefact(cfg, recipe, student, split, fit, time.time() - t0)


def teacher_split(cfg: DictConfig, target: Target) -> TeacherSplit:
    """The target's continuations of the training prompts (from the store), split into train
    and held out, plus ``data.forced_prompts`` read (not continued) by the target, for training only."""
    d = cfg.data
    n_forced = int(d.get("forced_prompts", 0))
    t_data = time.time()
    teacher = TeacherSet(cfg, target, int(d.num_prompts) + n_forced)
    # the last n_forced are read, not continued
    prompt_ids, n_prompts = teacher.prompts, len(teacher.prompts) - n_forced
    # read-only text has no conversation to continue: a second turn there is left out
    forced_ids = [p for p in prompt_ids[n_prompts:] if not isinstance(p, FollowUp)] if n_forced else []
    if n_prompts < 2:
        raise ConfigError(f"only {n_prompts} usable prompts; raise data.num_prompts or data.max_prompt_tokens.")
    settings = {**teacher.identity, "sequences": n_prompts}
    data = teacher.fill(n_prompts, bool(cfg.progress))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(int(d.seed)))
    n_held = round(len(data) * float(d.heldout))
    split = TeacherSplit(teacher, data, data.subset(order[n_held:]), data.subset(order[:n_held]), settings,
                         continued=len(data) - n_held, forced_prompts=len(forced_ids))
    split.seconds = time.time() - t_data
    if forced_ids:  # cheap extra positions: text the target reads (one forward each) instead of writes;
        # training only: the held-out metrics stay on text the target writes, as at decode time
        t_forced = time.time()
        key = data_key({**settings, "forced": forced_ids, "skip": "shared_prefix"})
        forced = forced_data(target.model, forced_ids, cache_dir=d.cache_dir, key=key, top_k=int(d.top_k),
                             batch_size=int(d.batch_size), progress=bool(cfg.progress))
        split.train, split.forced_positions = concat_data(split.train, forced), forced.positions
        split.seconds += time.time() - t_forced
    return split


def student_for(cfg: DictConfig, recipe: Recipe, target: Target, split: TeacherSplit) -> Student:
    """The recipe's untrained student on the target's device, with what it reads of the
    target taken from the store (`Recipe.preload`)."""
    student = recipe.make(cfg, target, split.train)
    student.lm.to(target.model.device)
    t_states = time.time()
    recipe.preload(student, split.data, split.teacher, cfg)
    split.seconds += time.time() - t_states
    return student


def add_student_data(cfg: DictConfig, student: Student, target: Target, split: TeacherSplit) -> None:
    """On-policy for the student too (``data.student_fraction``): its own continuations of
    that share of the continued training prompts, scored by the target, added to ``train``."""
    d = cfg.data
    n_student = round(split.continued * float(d.get("student_fraction", 0.0)))
    split.student_sequences = n_student
    if not n_student:
        return
    t_student = time.time()
    train = split.train
    prompts = [train.ids[i, : int(train.prompt_len[i])].tolist() for i in range(n_student)]
    vocab = None if student.vocab_ids is None else student.vocab_ids.tolist()
    skey = data_key({**split.settings, "student": OmegaConf.to_container(cfg.student), "vocab": vocab, "n": n_student})
    teacher = split.teacher
    extra = student_data(student, target.model, prompts, cache_dir=d.cache_dir, key=skey,
                         max_new_tokens=int(d.max_new_tokens), top_k=int(d.top_k),
                         temperature=float(d.temperature), batch_size=int(d.batch_size), eos_ids=teacher.eos_ids,
                         pad_id=teacher.pad_id, seed=int(d.seed), progress=bool(cfg.progress))
    split.train = concat_data(train, extra)
    split.seconds += time.time() - t_student


def batch_rows(step: int, lengths: torch.Tensor, size: int, groups: int, gen: torch.Generator,
               seed: int) -> torch.Tensor:
    """The rows of step ``step``'s batch of ``size``. With ``groups`` > 1 (``train.length_groups``):
    each block of ``groups`` steps draws ``groups * size`` distinct rows at random (fewer groups
    where the data holds fewer rows), sorts them by length and deals them out as batches of like
    lengths, in a random order; a batch then pads to its own length, not to the longest of a
    random draw (on SmolLM2's store, 32 random rows pad to ~2.5x their tokens, and the head's
    attention grows with the square). The block's draw is seeded by ``seed`` and the block, so a
    resumed run deals what an uninterrupted one did. With ``groups`` = 1: ``size`` rows at random
    from ``gen``."""
    groups = min(groups, len(lengths) // size)  # a pool of distinct rows: a row twice would share a batch
    if groups <= 1:
        return torch.randint(0, len(lengths), (size,), generator=gen)
    block = torch.Generator().manual_seed(seed * 1_000_003 + step // groups)
    pool = torch.randperm(len(lengths), generator=block)[: groups * size]
    pool = pool[torch.sort(lengths[pool], stable=True).indices]
    deal = torch.randperm(groups, generator=block)[step % groups]
    return pool[deal * size : (deal + 1) * size]


def train_student(cfg: DictConfig, recipe: Recipe, student: Student, split: TeacherSplit, full_vocab: int) -> Fit:
    """The training loop: AdamW on the recipe's loss (`Recipe.batch_metrics` + `Recipe.extra_loss`)
    with a warm-up-then-cosine learning rate, held-out evaluations every ``train.eval_every``
    steps, checkpoints (and resume), the ``train.max_seconds`` budget, and ``train.patience``: stop at
    a held-out plateau (that many evaluations without a better greedy alpha) and keep the best weights."""
    from tqdm import tqdm

    kind, metrics, held, train = str(cfg.loss), recipe.batch_metrics, split.held, split.train
    before = evaluate(student, held, full_vocab, kind, metrics=metrics)
    params = recipe.trainable(student, cfg)
    opt = torch.optim.AdamW(params, lr=float(cfg.train.lr), weight_decay=float(cfg.train.weight_decay))
    gen = torch.Generator().manual_seed(int(cfg.train.seed))
    out_dir = resolved(cfg.output.dir)  # what check_out_dir judged: the checkpoints go beside it
    ckpt = out_dir.parent / f".{out_dir.name}.checkpoints" / "last.safetensors"
    device = next(student.lm.parameters()).device
    dtype = compute_dtype(cfg, device)
    run = _result_config(cfg, dtype)  # what a checkpoint must share with this run to be resumed by it
    step = 0
    history: list[dict] = []  # one record per held-out evaluation
    ema: float | None = None
    earlier = 0.0  # training seconds of the stretches before this one
    if bool(cfg.train.resume) and not ckpt.is_file() and (old := ckpt.with_name("last.pt")).is_file():
        raise ConfigError(f"{old} is a checkpoint of an older spec-zoo (a pickle, which this version does not "
                          "read); finish that run with the version that began it, or delete it (or set "
                          "train.resume=false) to start over.")
    if bool(cfg.train.resume) and ckpt.is_file():
        step, history, ema, earlier = _load_checkpoint(ckpt, student, opt, gen, run)
        print(f"resumed from {ckpt} at step {step}", file=sys.stderr)
    budget = StepBudget(int(cfg.train.steps), float(cfg.train.get("max_seconds", 0) or 0), step)

    def spent() -> float:  # training seconds of the whole run: the earlier stretches' and this one's
        return earlier + time.time() - budget.start

    first, t_first = step, time.time()
    last_eval = history[-1]["alpha_greedy"] if history else before["alpha_greedy"]
    bs, groups = int(cfg.train.batch_size), int(cfg.train.get("length_groups", 1))
    lengths = train.prompt_len + train.gen_len
    plateau = Plateau(int(cfg.train.get("patience", 0) or 0), last_eval, step, params)
    stretch = float(cfg.train.get("budget_s", 0) or 0)  # this stretch's wall seconds (0 = to the end)
    from spec_zoo.runtime.cpp_kernels import host_isa

    print(f"training path: {device.type}, host ISA {host_isa()}, train.dtype={cfg.train.get('dtype', 'float32')} "
          f"-> {str(dtype).removeprefix('torch.')}; {budget.steps - step} steps to run, their cost timed over steps "
          f"{step + 2}..{step + 3}", file=sys.stderr)
    bar = tqdm(total=budget.steps, initial=step, desc=f"{recipe.desc} ({kind})", disable=not cfg.progress,
               dynamic_ncols=True)
    while step < budget.steps:
        student.lm.train()
        rows = batch_rows(step, lengths, bs, groups, gen, int(cfg.train.seed))
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg, budget.steps)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = metrics(student, train, rows, full_vocab, kind)["loss"].float().mean()
            if (extra := recipe.extra_loss(student, cfg)) is not None:  # a recipe's own term beside the distillation
                loss = loss + extra
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if float(cfg.train.grad_clip) > 0:
            torch.nn.utils.clip_grad_norm_(params, float(cfg.train.grad_clip))
        opt.step()
        step += 1
        if step == first + 3:  # the cost, once the first steps (allocations, caches) are behind
            per_step = (time.time() - t_first) / 2
            print(f"training path: {per_step:.3g} s/step, ~{per_step * (budget.steps - step) / 60:.1f} min for the "
                  f"{budget.steps - step} steps left", file=sys.stderr)
        elif step == first + 1:
            t_first = time.time()
        value = float(loss.detach())
        ema = value if ema is None else 0.9 * ema + 0.1 * value
        if step % int(cfg.train.eval_every) == 0 or step == budget.steps:
            heldout = evaluate(student, held, full_vocab, kind, metrics=metrics)
            history.append({"step": step, "train_loss": round(ema, 4), **heldout})
            last_eval = heldout["alpha_greedy"]
            if plateau.reached(last_eval, step, params):
                print(f"train.patience={plateau.patience}: held-out alpha {plateau.best:.4f} at step {plateau.step} "
                      f"not bettered in {plateau.patience} evaluations; stopped at step {step}", file=sys.stderr)
                break
        if step % int(cfg.train.ckpt_every) == 0 and step < budget.steps:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            _save_checkpoint(ckpt, student, opt, step, gen, history, ema, run, spent())
        if stretch and step < budget.steps and time.time() - budget.start >= stretch:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            _save_checkpoint(ckpt, student, opt, step, gen, history, ema, run, spent())
            bar.close()
            print(f"train.budget_s={stretch:g}: stopped at step {step} of {budget.steps}, checkpointed in {ckpt}; "
                  "rerun the same command (train.resume=true) to continue", file=sys.stderr)
            return Fit(step, before, {}, history, spent(), ckpt, paused=True)
        if budget.after_step(step):
            bar.total = budget.steps
            print(f"train.max_seconds={budget.max_seconds:g}: {budget.steps} steps fit "
                  f"(of train.steps={cfg.train.steps})", file=sys.stderr)
        bar.set_postfix(loss=f"{ema:.4f}", heldout_alpha=f"{last_eval:.3f}")
        bar.update(1)
    bar.close()
    if plateau.patience and plateau.step != step:
        print(f"train.patience: kept step {plateau.step}'s weights (the best held-out alpha)", file=sys.stderr)
        plateau.restore(params)
    seconds = spent()  # before the final evaluation, as ever
    return Fit(step, before, evaluate(student, held, full_vocab, kind, metrics=metrics), history, seconds, ckpt)


class Plateau:
    """``train.patience`` (0 = off): the best held-out greedy alpha so far, with a copy of the trained
    parameters at it (restored when training ends); reached when ``patience`` evaluations in a row have
    not bettered it. A resumed run starts from the checkpoint's weights and its last evaluation."""

    def __init__(self, patience: int, alpha: float, step: int, params: Sequence[torch.Tensor]):
        self.patience, self.best, self.step, self.stale = patience, alpha, step, 0
        self.weights = [p.detach().clone() for p in params] if patience else []

    def reached(self, alpha: float, step: int, params: Sequence[torch.Tensor]) -> bool:
        if not self.patience:
            return False
        if alpha > self.best:
            self.best, self.step, self.stale = alpha, step, 0
            self.weights = [p.detach().clone() for p in params]
            return False
        self.stale += 1
        return self.stale >= self.patience

    def restore(self, params: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, w in zip(params, self.weights):
                p.copy_(w)


class StepBudget:
    """``train.steps``, cut by a wall-time budget (``train.max_seconds``, 0 = none): steps are
    timed after a warm-up (steps 5..25 after the first), then as many as fit are kept, on a
    schedule that ends there; what the estimate missed (held-out evaluations, a machine that
    slowed) ends the loop when the budget is spent."""

    def __init__(self, steps: int, max_seconds: float, first: int):
        self.steps, self.max_seconds = steps, max_seconds
        self.mark, self.timed = first + 5, first + 25
        self.start = self.t_mark = time.time()

    def after_step(self, step: int) -> bool:
        """Note that ``step`` steps are done; True when the budget just cut ``steps``."""
        if step == self.mark:
            self.t_mark = time.time()
        if self.max_seconds and step == self.timed:
            per_step = (time.time() - self.t_mark) / (self.timed - self.mark)
            fit = step + int((self.max_seconds - (time.time() - self.start)) / per_step)
            if fit < self.steps:
                self.steps = max(step, fit)
                return True
        if self.max_seconds and step < self.steps and time.time() - self.start >= self.max_seconds:
            self.steps = step
            return True
        return False


def write_artefact(cfg: DictConfig, recipe: Recipe, student: Student, split: TeacherSplit, fit: Fit,
                   elapsed: float) -> Path:
    """The artefact with its training record (data, loss, steps, held-out metrics, times,
    config), written from the CPU; the checkpoint removed unless ``train.keep_checkpoints``."""
    d = cfg.data
    record = {
        "data": {"prompts": str(d.prompts or "spec_zoo/train/data/prompts.jsonl.gz"),
                 "store": str(split.teacher.store.root), "mixture": split.teacher.taken,
                 "sequences": len(split.data) + split.forced_prompts,
                 "train_sequences": len(split.train), "heldout_sequences": len(split.held),
                 "positions": split.data.positions + split.forced_positions,
                 "student_sequences": split.student_sequences, "forced_prompts": int(d.get("forced_prompts", 0)),
                 "max_new_tokens": int(d.max_new_tokens), "top_k": int(d.top_k), "temperature": float(d.temperature),
                 "chat": bool(d.chat)},
        "loss": str(cfg.loss),
        "steps": fit.steps,
        "batch_size": int(cfg.train.batch_size),
        "heldout_before": fit.before,
        "heldout_after": fit.after,
        "history": fit.history,
        "time_s": {"data": round(split.seconds, 3), "train": round(fit.seconds, 3), "total": round(elapsed, 3)},
        "threads": int(cfg.threads),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    student.lm.to("cpu")  # artefacts are written from (and load to) the CPU
    path = recipe.save(student, cfg, split.teacher.identity["target"], record)
    if fit.checkpoint.is_file() and not bool(cfg.train.keep_checkpoints):
        fit.checkpoint.unlink()
        try:
            fit.checkpoint.parent.rmdir()
        except OSError:
            pass
    before, after = fit.before, fit.after
    print(f"held-out alpha (greedy) {before['alpha_greedy']:.3f} -> {after['alpha_greedy']:.3f}; "
          f"1-TV {before['alpha_sampled']:.3f} -> {after['alpha_sampled']:.3f}; "
          f"data {split.seconds:.0f}s, train {fit.seconds:.0f}s; saved {path}", file=sys.stderr)
    return path
