"""``spec-zoo-train report``: held-out acceptance of trained artefacts, by draft position and
by prompt category (conf/train_report.yaml).

The target writes greedy continuations of held-out prompts (``report.per_category`` per
category of the mixture, from the far end of each category's order and never a prompt of
``report.exclude``, the files the artefacts were trained on); each artefact then drafts
every chain along them, teacher-forced. Position s of a chain starting at token r is the
depth-s draft of token r + s - 1, as the artefact's recipe computes it
(`spec_zoo.train.recipe.Recipe.depth_matches`): the EAGLE head from its own s - 1 guessed
features (unrolled), Medusa head s from the state before r, and for drafts that read
tokens only (distilled draft, exit adapter) the same as depth 1. Which recipe reads an
artefact is found by its record file (`spec_zoo.train.methods`). ``alpha`` at position s is
the greedy acceptance given positions 1..s-1 were accepted, over chains that fit in the
continuation (the issue's "second position given the first").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.target import Target
from spec_zoo.train.batches import teacher_positions
from spec_zoo.train.data import PACKAGED_PROMPTS, TeacherData, read_records
from spec_zoo.train.loop import load_teacher_target
from spec_zoo.train.methods import recipe_of_artefact, recipes
from spec_zoo.train.mixture import categories, mixture_texts
from spec_zoo.train.recipe import Recipe, Student
from spec_zoo.train.store import TeacherSet


@torch.no_grad()
def depth_matches(recipe: Recipe, student: Student, data: TeacherData, rows: torch.Tensor, full_vocab: int,
                  depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per teacher row (a generated token) of ``rows``: [N, depth] bool, column s - 1 = the
    depth-s draft of that token is the target's argmax (`Recipe.depth_matches`); and each
    row's place in its continuation."""
    ids, mask, where, t_ids, _, _ = teacher_positions(student, data, rows, full_vocab)
    gen = data.gen_len[rows].tolist()
    local = torch.cat([torch.arange(g) for g in gen])
    return torch.stack(recipe.depth_matches(student, ids, mask, where, t_ids, local, depth), 1), local


def chain_alpha(matches: torch.Tensor, local: torch.Tensor, gen: torch.Tensor,
                start: int = 0) -> list[tuple[int, int]]:
    """(accepted, reached) per position over every chain that fits and starts at continuation
    position ``start`` or later (`Recipe.chain_start`): chain r's position s is
    ``matches[r + s - 1, s - 1]``."""
    D = matches.shape[1]
    fits = (local + D <= gen) & (local >= start)
    starts = fits.nonzero()[:, 0]
    alive = torch.stack([matches[starts + s, s] for s in range(D)], 1).long().cumprod(1)
    reached = torch.cat([torch.tensor([len(starts)]), alive[:, :-1].sum(0)])
    return [(int(a), int(r)) for a, r in zip(alive.sum(0), reached)]


def measure(recipe: Recipe, student: Student, data: TeacherData, names: list[str], full_vocab: int, depth: int,
            batch_size: int = 8) -> dict:
    """{category: [(accepted, reached) per position]} plus ``all``."""
    counts: dict[str, list[list[int]]] = {}
    for s in range(0, len(data), batch_size):
        rows = torch.arange(s, min(s + batch_size, len(data)))
        m, local = depth_matches(recipe, student, data, rows, full_vocab, depth)
        gen = torch.cat([torch.full((int(data.gen_len[i]),), int(data.gen_len[i])) for i in rows.tolist()])
        seq = torch.cat([torch.full((int(data.gen_len[i]),), i) for i in rows.tolist()])
        for i in rows.tolist():
            pick = seq == i
            name = names[int(data.category[i])] if int(data.category[i]) >= 0 else "other"
            for cat in (name, "all"):
                acc = counts.setdefault(cat, [[0, 0] for _ in range(depth)])
                for d, (a, r) in enumerate(chain_alpha(m[pick], local[pick], gen[pick], recipe.chain_start)):
                    acc[d][0] += a
                    acc[d][1] += r
    return counts


def shipped() -> list[Path]:
    """Every artefact shipped in a method package (``drafters/<method>/artefacts/<name>/``)."""
    import spec_zoo.drafters

    root = Path(spec_zoo.drafters.__file__).parent
    records = {cls.artefact[0] for cls in recipes().values()}
    return sorted(p.parent for p in root.glob("*/artefacts/*/*.json") if p.name in records)


def run_report(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train report`` (conf/train_report.yaml); return the markdown file."""
    r = cfg.report
    if int(r.per_category) < 1 or int(r.depth) < 1:
        raise ConfigError(f"report.per_category={r.per_category}, report.depth={r.depth}; both must be >= 1.")
    paths = [Path(p).expanduser() for p in r.artefacts] if r.artefacts else shipped()
    if not paths:
        raise ConfigError("report.artefacts: no artefacts given and none shipped; give report.artefacts=[DIR, ...].")
    readers = [recipe_of_artefact(p)() for p in paths]  # each artefact's recipe, with its defaults
    torch.set_num_threads(int(cfg.threads))
    target = target or load_teacher_target(cfg)
    exclude = None
    if cfg.data.get("token_ids") is None:
        exclude = frozenset(rec["prompt"] for f in (r.exclude or [PACKAGED_PROMPTS]) for rec in read_records(f))
        if int(r.get("exclude_mixture", 0)):  # what a recipe with data.num_prompts=N on these data settings trained on
            exclude |= frozenset(mixture_texts(target.tokenizer, cfg.data, categories(cfg.data),
                                               int(r.exclude_mixture)))
    teacher = TeacherSet(cfg, target, int(r.per_category) * 64, heldout=exclude, per_category=int(r.per_category))
    data = teacher.fill(len(teacher.prompts), bool(cfg.progress))
    results: dict[str, dict] = {}
    for path, recipe in zip(paths, readers):
        student = recipe.load(path, target.model)
        name = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
        results[name] = {"kind": recipe.drafter, "alpha": measure(recipe, student, data, teacher.names,
                                                                  target.vocab_size, int(r.depth))}
        print(f"{path.name}: position 1 alpha {_alpha(results[name]['alpha']['all'][0]):.3f}", file=sys.stderr)
    out = Path(r.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    sizes = {n: sum(1 for c in teacher.categories if teacher.names[c] == n) for n in teacher.names}
    meta = {"prompts": sizes, "max_new_tokens": int(cfg.data.max_new_tokens), "depth": int(r.depth),
            "positions": data.positions, "prompts_file": str(cfg.data.prompts or "packaged")}
    (out / "acceptance.json").write_text(json.dumps({"settings": meta, "artefacts": results}, indent=1))
    md = out / "report.md"
    md.write_text(_markdown(results, meta, teacher.names))
    _plot(results, out / "acceptance.png")
    return md


def _alpha(pair) -> float:
    a, r = pair
    return a / r if r else float("nan")


def _markdown(results: dict, meta: dict, names: list[str]) -> str:
    D = meta["depth"]
    lines = ["# Acceptance by draft position and prompt category", "",
             f"Held-out prompts per category: {', '.join(f'{k} {v}' for k, v in meta['prompts'].items())} "
             f"(from {meta['prompts_file']}, none trained on); {meta['max_new_tokens']} greedy target tokens each, "
             f"{meta['positions']} positions. alpha at position s: greedy acceptance of the depth-s draft given "
             "positions 1..s-1 were accepted (teacher-forced chains, `spec-zoo-train report`).", ""]
    lines += ["| artefact | kind | " + " | ".join(f"pos {s + 1}" for s in range(D)) + " | " + " | ".join(
        f"{n} (pos 1)" for n in names) + " |", "|" + "---|" * (2 + D + len(names))]
    for path, res in results.items():
        a = res["alpha"]
        cells = [f"{_alpha(a['all'][s]):.3f}" for s in range(D)]
        cells += [f"{_alpha(a[n][0]):.3f}" if n in a else "-" for n in names]
        lines.append(f"| `{Path(path).name}` | {res['kind']} | " + " | ".join(cells) + " |")
    lines += ["", "Per category and position (accepted / reached):", ""]
    for path, res in results.items():
        lines += [f"**`{Path(path).name}`**", "", "| category | " + " | ".join(f"pos {s + 1}" for s in range(D)) + " |",
                  "|" + "---|" * (1 + D)]
        for n in [*names, "all"]:
            if n in res["alpha"]:
                lines.append(f"| {n} | " + " | ".join(f"{_alpha(p):.3f} ({p[0]}/{p[1]})" if p[1] else "- (0/0)"
                                                      for p in res["alpha"][n]) + " |")
        lines.append("")
    lines += ["![acceptance by position](acceptance.png)", ""]
    return "\n".join(lines)


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for name, res in results.items():
        alpha = [_alpha(p) for p in res["alpha"]["all"]]
        ax.plot(range(1, len(alpha) + 1), alpha, marker="o", label=Path(name).name)
    ax.set_xticks(range(1, len(next(iter(results.values()))["alpha"]["all"]) + 1))
    ax.set_xlabel("draft position (given the earlier ones accepted)")
    ax.set_ylabel("held-out greedy acceptance")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
