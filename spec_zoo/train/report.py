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
continuation (the issue's "second position given the first"), overall and by depth bucket
(where in the answer the chain starts, ``report.depth_buckets``).

``report.prompts=workloads`` measures on prompts shaped like real use instead of the
mixture's (`spec_zoo.train.workloads`: conversations scored on the second answer, long
documents, translation); ``report.compare`` sets the result beside a benchmark run's
(`spec_zoo.train.bench_match`).

The held-out continuations are the long part: they live in a store of their own, so
``data.budget_s`` stops the report there (nothing measured or written) and the same command,
rerun, goes on from the shards on disk.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.outputs import atomic_write, check_outputs, save_figure, signed_markdown
from spec_zoo.runtime.target import Target
from spec_zoo.train.batches import teacher_positions
from spec_zoo.train.bench_match import bench_position1, closeness
from spec_zoo.train.data import PACKAGED_PROMPTS, TeacherData, read_records
from spec_zoo.train.loop import load_teacher_target
from spec_zoo.train.methods import recipe_of_artefact, recipes
from spec_zoo.train.mixture import categories, mixture_texts
from spec_zoo.train.recipe import Recipe, Student
from spec_zoo.train.store import TeacherSet, data_budget
from spec_zoo.train.workloads import workload_prompts


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
                start: int = 0, stop: int | None = None) -> list[tuple[int, int]]:
    """(accepted, reached) per position over every chain that fits and starts at continuation
    position ``start`` or later (`Recipe.chain_start`) and before ``stop``: chain r's
    position s is ``matches[r + s - 1, s - 1]``."""
    D = matches.shape[1]
    fits = (local + D <= gen) & (local >= start) & (local < (stop if stop is not None else gen.max() + 1))
    starts = fits.nonzero()[:, 0]
    alive = torch.stack([matches[starts + s, s] for s in range(D)], 1).long().cumprod(1)
    reached = torch.cat([torch.tensor([len(starts)]), alive[:, :-1].sum(0)])
    return [(int(a), int(r)) for a, r in zip(alive.sum(0), reached)]


def bucket_labels(starts: list[int]) -> list[str]:
    """``[0, 32, 64]`` -> ``["0-31", "32-63", "64+"]``: the continuation positions of each depth bucket."""
    return [f"{a}-{b - 1}" for a, b in itertools.pairwise(starts)] + [f"{starts[-1]}+"]


def measure(recipe: Recipe, student: Student, data: TeacherData, names: list[str], full_vocab: int, depth: int,
            buckets: Sequence[int] = (0,), batch_size: int = 8) -> dict:
    """{category: {bucket: [(accepted, reached) per position]}} plus the category ``all`` and
    the bucket ``all``; a chain is in the depth bucket of its first token's place in the
    continuation (``buckets``: where each starts)."""
    spans = list(zip(bucket_labels(list(buckets)), buckets, [*buckets[1:], None]))
    counts: dict[str, dict[str, list[list[int]]]] = {}
    for s in range(0, len(data), batch_size):
        rows = torch.arange(s, min(s + batch_size, len(data)))
        m, local = depth_matches(recipe, student, data, rows, full_vocab, depth)
        gen = torch.cat([torch.full((int(data.gen_len[i]),), int(data.gen_len[i])) for i in rows.tolist()])
        seq = torch.cat([torch.full((int(data.gen_len[i]),), i) for i in rows.tolist()])
        for i in rows.tolist():
            pick = seq == i
            name = names[int(data.category[i])] if int(data.category[i]) >= 0 else "other"
            for label, lo, hi in [("all", 0, None), *spans]:
                pairs = chain_alpha(m[pick], local[pick], gen[pick], max(lo, recipe.chain_start), hi)
                for cat in (name, "all"):
                    acc = counts.setdefault(cat, {}).setdefault(label, [[0, 0] for _ in range(depth)])
                    for d, (a, r) in enumerate(pairs):
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
    data_budget(cfg.data)  # the held-out teacher data is the long part: it stops and resumes by shards
    if r.prompts not in ("mixture", "workloads"):
        raise ConfigError(f"report.prompts={r.prompts!r}; use mixture (the training mixture's categories) or "
                          "workloads (prompts shaped like real use, report.workloads).")
    buckets = [int(b) for b in r.depth_buckets]
    if not buckets or buckets[0] != 0 or buckets != sorted(set(buckets)):
        raise ConfigError(f"report.depth_buckets={list(buckets)}; give increasing continuation positions starting "
                          "at 0, e.g. [0, 32, 64, 96].")
    out = check_outputs(r.out, ("acceptance.json", "report.md", "acceptance.png", "against_bench.png"), "report.out",
                        "give report.out a new directory, or move that file away")  # before any work
    paths = [Path(p).expanduser() for p in r.artefacts] if r.artefacts else shipped()
    if not paths:
        raise ConfigError("report.artefacts: no artefacts given and none shipped; give report.artefacts=[DIR, ...].")
    readers = [recipe_of_artefact(p)() for p in paths]  # each artefact's recipe, with its defaults
    compare = _compare_runs(r.compare, [p.name for p in paths])
    bench = {name: bench_position1(run, method) for name, (run, method) in compare.items()}
    torch.set_num_threads(int(cfg.threads))
    target = target or load_teacher_target(cfg)
    exclude = None
    if cfg.data.get("token_ids") is None:
        exclude = frozenset(rec["prompt"] for f in (r.exclude or [PACKAGED_PROMPTS]) for rec in read_records(f))
        if int(r.get("exclude_mixture", 0)):  # what a recipe with data.num_prompts=N on these data settings trained on
            exclude |= frozenset(mixture_texts(target.tokenizer, cfg.data, categories(cfg.data),
                                               int(r.exclude_mixture)))
    given = workload_prompts(target, cfg, exclude or frozenset()) if r.prompts == "workloads" else None
    teacher = TeacherSet(cfg, target, int(r.per_category) * 64, heldout=exclude, per_category=int(r.per_category),
                         heldout_ngram=int(r.get("train_ngram", 0)),
                         given=given)
    data = teacher.fill(len(teacher.prompts), bool(cfg.progress))
    results: dict[str, dict] = {}
    for path, recipe in zip(paths, readers):
        student = recipe.load(path, target.model)
        name = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
        counts = measure(recipe, student, data, teacher.names, target.vocab_size, int(r.depth), buckets)
        results[name] = {"kind": recipe.drafter, "alpha": {c: v["all"] for c, v in counts.items()},
                         "by_depth": counts}
        if path.name in bench:
            ours = {c: _alpha(v["all"][0]) for c, v in counts.items()}
            theirs = {c: _alpha(v) for c, v in bench[path.name].items()}
            results[name]["bench"] = {"method": compare[path.name][1], "run": compare[path.name][0],
                                      "position1": bench[path.name],
                                      **closeness(ours, theirs)}
        print(f"{path.name}: position 1 alpha {_alpha(results[name]['alpha']['all'][0]):.3f}", file=sys.stderr)
    sizes = {n: sum(1 for c in teacher.categories if teacher.names[c] == n) for n in teacher.names}
    meta = {"prompts": sizes, "max_new_tokens": int(cfg.data.max_new_tokens), "depth": int(r.depth),
            "positions": data.positions, "prompts_file": str(cfg.data.prompts or "packaged"),
            "kind": str(r.prompts), "depth_buckets": bucket_labels(buckets),
            "prompt_tokens": _prompt_tokens(data, teacher.names),
            **({"bench_overlap_dropped": given.dropped, "bench_questions": str(r.bench_questions or "spec_bench"),
                "bench_ngram": int(r.bench_ngram), "train_overlap_dropped": given.seen,
                "train_ngram": int(r.get("train_ngram", 0))} if given is not None else {}),
            **({"compare": {n: {"results": run, "method": m} for n, (run, m) in compare.items()}} if compare else {})}
    atomic_write(out / "acceptance.json", json.dumps(
        {"format": "spec-zoo-acceptance-report", "settings": meta, "artefacts": results}, indent=1))
    md = atomic_write(out / "report.md",
                      signed_markdown(_markdown(results, meta, teacher.names), "spec-zoo-train report"))
    _plot(results, out / "acceptance.png")
    if compare:
        plot_against_bench(results, out / "against_bench.png")
    return md


def _compare_runs(compare, artefacts: list[str]) -> dict[str, tuple[str, str]]:
    """artefact name -> (bench run dir, bench method) from ``report.compare``: each method of
    ``compare.methods`` is a method name of the run ``compare.results``, or ``{results: DIR,
    method: NAME}`` for an artefact benchmarked in another run."""
    out = {}
    for name, spec in (compare.methods or {}).items():
        run, method = (spec.get("results"), spec.get("method")) if hasattr(spec, "get") else (compare.results, spec)
        if not run or not method:
            raise ConfigError(f"report.compare.methods.{name}: no bench run or method; set report.compare.results=DIR "
                              "or give {results: DIR, method: NAME} for this artefact.")
        out[str(name)] = (str(run), str(method))
    unknown = sorted(set(out) - set(artefacts))
    if unknown:
        raise ConfigError(f"report.compare.methods names {unknown}, not an artefact of this report; key it by the "
                          f"artefact's directory name ({', '.join(artefacts)}).")
    return out


def _prompt_tokens(data: TeacherData, names: list[str]) -> dict[str, list[int]]:
    """Prompt lengths per category (min, median, max): how long the contexts were."""
    out = {}
    for c, n in enumerate(names):
        lengths = sorted(int(x) for x in data.prompt_len[data.category == c])
        if lengths:
            out[n] = [lengths[0], lengths[len(lengths) // 2], lengths[-1]]
    return out


def _alpha(pair) -> float:
    a, r = pair
    return a / r if r else float("nan")


def _markdown(results: dict, meta: dict, names: list[str]) -> str:
    D, labels = meta["depth"], meta["depth_buckets"]
    what = ("prompts shaped like real use (`report.prompts=workloads`: conversations scored on the answer to a "
            "follow-up, long documents, translation), none trained on, none sharing "
            f"{meta.get('bench_ngram')} words with {Path(str(meta.get('bench_questions'))).name}"
            f" (dropped: {', '.join(f'{k} {v}' for k, v in meta.get('bench_overlap_dropped', {}).items())}), "
            f"none sharing {meta.get('train_ngram')} words with a training prompt (dropped: "
            f"{', '.join(f'{k} {v}' for k, v in meta.get('train_overlap_dropped', {}).items())})"
            if meta["kind"] == "workloads" else "none trained on")
    lines = ["# Acceptance by draft position and prompt category", "",
             f"Held-out prompts per category: {', '.join(f'{k} {v}' for k, v in meta['prompts'].items())} "
             f"(from {meta['prompts_file']}; {what}); {meta['max_new_tokens']} greedy target tokens each, "
             f"{meta['positions']} positions. Prompt tokens (min / median / max): "
             f"{', '.join(f'{k} {a}/{b}/{c}' for k, (a, b, c) in meta['prompt_tokens'].items())}. "
             "alpha at position s: greedy acceptance of the depth-s draft given positions 1..s-1 were accepted "
             "(teacher-forced chains from every token of the answer, `spec-zoo-train report`).", ""]
    lines += ["| artefact | kind | " + " | ".join(f"pos {s + 1}" for s in range(D)) + " | " + " | ".join(
        f"{n} (pos 1)" for n in names) + " |", "|" + "---|" * (2 + D + len(names))]
    for path, res in results.items():
        a = res["alpha"]
        cells = [f"{_alpha(a['all'][s]):.3f}" for s in range(D)]
        cells += [f"{_alpha(a[n][0]):.3f}" if n in a else "-" for n in names]
        lines.append(f"| `{Path(path).name}` | {res['kind']} | " + " | ".join(cells) + " |")
    lines += ["", "By depth in the answer (the continuation position a chain starts at), all categories: "
              "position 1 / position 2 given 1:", "",
              "| artefact | " + " | ".join(labels) + " |", "|" + "---|" * (1 + len(labels))]
    for path, res in results.items():
        cells = [" / ".join(f"{_alpha(res['by_depth']['all'][b][s]):.3f}" for s in range(min(D, 2))) for b in labels]
        lines.append(f"| `{Path(path).name}` | " + " | ".join(cells) + " |")
    compared = {p: res["bench"] for p, res in results.items() if "bench" in res}
    if compared:
        lines += ["", "Against the benchmark (`report.compare`): position 1 per category, report / bench "
                  "(bench from its per-step traces):", "",
                  "| artefact | bench method | " + " | ".join(names) + " | mean abs diff | max abs diff | "
                  "Spearman |", "|" + "---|" * (5 + len(names))]
        for path, b in compared.items():
            ours = results[path]["alpha"]
            cells = [f"{_alpha(ours[n][0]):.2f} / {_alpha(b['position1'][n]):.2f}"
                     if n in ours and n in b["position1"] else "-" for n in names]
            lines.append(f"| `{Path(path).name}` | {b['method']} ({Path(b['run']).name}) | " + " | ".join(cells)
                         + f" | {b['mean_abs_diff']:.3f} | {b['max_abs_diff']:.3f} | {b['spearman']:.2f} |")
        lines += ["", "![report against bench, position 1 per category](against_bench.png)"]
    lines += ["", "Per category and position (accepted / reached):", ""]
    for path, res in results.items():
        lines += [f"**`{Path(path).name}`**", "", "| category | " + " | ".join(f"pos {s + 1}" for s in range(D))
                  + " | " + " | ".join(f"pos 1, {b}" for b in labels) + " |", "|" + "---|" * (1 + D + len(labels))]
        for n in [*names, "all"]:
            if n in res["alpha"]:
                cells = [_cell(p) for p in res["alpha"][n]] + [_cell(res["by_depth"][n][b][0]) for b in labels]
                lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["![acceptance by position](acceptance.png)", ""]
    return "\n".join(lines)


def _cell(pair) -> str:
    return f"{_alpha(pair):.3f} ({pair[0]}/{pair[1]})" if pair[1] else "- (0/0)"


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
    save_figure(fig, path, 110)
    plt.close(fig)


def plot_against_bench(results: dict, path: Path, band: float = 0.05) -> None:
    """Position 1 per category, report (x) against the bench (y), one colour per artefact: on
    the diagonal the report predicts the bench; the band is the issue's +-0.05."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.fill_between([0, 1], [-band, 1 - band], [band, 1 + band], color="0.9", label=f"within {band}")
    ax.plot([0, 1], [0, 1], color="0.5", lw=0.8)
    marks = dict(zip(sorted({c for r in results.values() for c in r.get("bench", {}).get("categories", [])}),
                     "os^vDP*X"))
    compared = [(name, res) for name, res in results.items() if "bench" in res]
    for i, (name, res) in enumerate(compared):
        b, colour = res["bench"], f"C{i}"
        for c in b["categories"]:
            ax.plot([_alpha(res["alpha"][c][0])], [_alpha(b["position1"][c])], ls="none", marker=marks[c],
                    color=colour, ms=6)
        ax.plot([], [], ls="none", marker="o", color=colour, label=Path(name).name)
    for c, m in marks.items():
        ax.plot([], [], ls="none", marker=m, color="0.3", label=c)
    ax.set(xlim=(0, 0.8), ylim=(0, 0.8), xlabel="acceptance report, position 1",
           ylabel="benchmark (its traces), position 1")
    ax.grid(alpha=0.3)
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    save_figure(fig, path, 110)
    plt.close(fig)
