"""Merge results files (one per job of a sweep, or several runs) and write a markdown
report with tables and PNG figures.

Each record is paired with the baseline of its own file (``_source``), so every speedup
is against the `ar` measured in the same run. Rows are methods; when the merged files
hold several configurations of one method name (a ``method_params`` sweep, temperatures,
models), the settings that differ are added to the row label, e.g. ``ngram [num_draft=4]``
or ``ngram [T=0.5]``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spec_zoo.bench.records import BASELINE, check_schema, method_label, read_records, unique_records
from spec_zoo.bench.summary import NEAR_TIE, OVERALL, Summary, summarize
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem
from spec_zoo.outputs import check_replaceable, resolved, save_figure, signed_markdown, write_owned

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: run-level fields that tell configurations of one method apart (shown when they differ)
RUN_FIELDS = (("model", "model"), ("temperature", "T"), ("max_new_tokens", "max_new"), ("dataset", "dataset"))


def find_results(paths: Sequence) -> list[Path]:
    """The results files named by ``paths``: files as given, directories searched
    recursively for ``results.jsonl`` (or ``results.jsonl.gz``, as the docs keep the runs they read)."""
    found = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted([*p.rglob("results.jsonl"), *p.rglob("results.jsonl.gz")])
        else:
            raise ConfigError(f"paths: {file_problem(p)}; pass results.jsonl files or "
                              "directories holding them.")
    if not found:
        raise ConfigError(f"paths: no results.jsonl under {', '.join(map(str, paths))}; run spec-zoo-bench first "
                          "(its out= directory holds results.jsonl).")
    return found


def load_results(paths: Sequence) -> list[dict]:
    """All records of the results files under ``paths`` (schema-checked), each tagged with
    ``_source`` (its file), with duplicates (the same record key in one file) dropped with a warning."""
    records = []
    for file in find_results(paths):
        unique, duplicates = unique_records(check_schema(read_records(file), str(file)), str(file))
        if duplicates:
            warnings.warn(duplicates, stacklevel=2)
        records += [{**r, "_source": str(file)} for r in unique]
    if not records:
        raise ConfigError(f"paths: the results files under {', '.join(map(str, paths))} hold no records yet; "
                          "let spec-zoo-bench finish at least one question.")
    return records


def labeller(records: Sequence[dict]) -> Callable[[dict], str]:
    """``label(record)``: the method, plus whatever differs between configurations of it."""
    variants: dict[str, dict] = {}
    for r in records:
        variants.setdefault(r["method"], {})[r["config_hash"]] = r
    varying: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for method, configs in variants.items():
        if len(configs) < 2:
            continue
        rs = list(configs.values())
        keys = sorted({k for r in rs for k in (r.get("params") or {})})
        params = [k for k in keys if len({json.dumps((r.get("params") or {}).get(k), sort_keys=True) for r in rs}) > 1]
        run = [(f, short) for f, short in RUN_FIELDS if len({json.dumps(r.get(f)) for r in rs}) > 1]
        varying[method] = (params, run)

    def label(r: dict) -> str:
        name = method_label(r)
        if r["method"] not in varying:
            return name
        params, run = varying[r["method"]]
        parts = [f"{k}={(r.get('params') or {}).get(k)}" for k in params] + [f"{s}={r.get(f)}" for f, s in run]
        return f"{name} [{', '.join(parts)}]" if parts else f"{name} [{r['config_hash']}]"

    return label


def _num_draft(r: dict) -> float | None:
    """The fixed draft length a record's params set, under whichever name its drafter uses."""
    params = r.get("params") or {}
    for key in ("num_draft", "prompt_lookup_num_tokens", "num_assistant_tokens"):
        if isinstance(params.get(key), (int, float)):
            return params[key]
    return None


#: what to do when -o names a file spec-zoo did not write
REPORT_FIX = "give -o a new directory or .md path, or pass --overwrite to replace it"


def report_paths(out_dir, overwrite: bool = False) -> tuple[Path, Path]:
    """(the markdown, the figures directory) a report into ``out_dir`` writes (a directory,
    or a .md path), `resolved` and checked before any work: each file it would replace (the
    markdown, a figure of the same name) must be one spec-zoo wrote, unless ``overwrite``;
    a directory's other files are never touched."""
    out = resolved(out_dir)
    md = out if out.suffix == ".md" else out / "report.md"
    figures = md.parent / "figures"
    for path in (md.parent, figures):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"-o: {path} exists and is not a directory; give a new directory (report.md and "
                              "figures/ go in it) or a .md path.")
    check_replaceable(md, "-o", REPORT_FIX, overwrite)
    for png in sorted(figures.glob("*.png")) if figures.is_dir() else ():
        check_replaceable(png, "-o", f"{REPORT_FIX} (figures/ holds a {png.name} spec-zoo did not draw)", overwrite)
    return md, figures


def build_report(paths: Sequence, out_dir, title: str = "Benchmark report", seed: int = 0,
                 figures: bool = True, note: str | None = None, overwrite: bool = False) -> Path:
    """Write ``out_dir/report.md`` (or the file ``out_dir`` when it ends in .md) and its
    figures (``figures/`` next to it); return the markdown path. The page leads with the
    answer (a sentence, the ranked speedups, the method x category heatmap); the protocol
    and the detailed tables follow. Only files spec-zoo wrote are replaced (`report_paths`),
    each atomically."""
    md_path, fig_dir = report_paths(out_dir, overwrite)
    records = load_results(paths)
    label = labeller(records)
    summary = summarize(records, label=label, seed=seed)
    context = run_context(records)
    data = FigureData(summary, records, label, fig_dir, context)
    plots = _plots(data) if figures else {}

    def image(key: str, alt: str) -> list[str]:
        return [f"![{alt}]({_rel(plots[key], md_path)})", ""] if key in plots else []

    lines = [f"# {title}", ""]
    lines += [f"> warning: {w}" for w in summary.warnings]
    if context.small:
        lines += [f"> warning: {context.small}", ""]
    lines += _answer(summary, records, data.lossless)
    lines += image("overall", "overall speedup per method, sorted, with 95% CIs")
    lines += image("speedup", "speedup by method and category")
    lines += _protocol(records, note)
    lines += ["## Overall", ""] + _overall_table(summary)
    lines += summary.table("Speedup by category", "speedup", "{:.2f}x")
    lines += summary.table("Speedup 95% CI by category", "speedup_ci", "[{0:.2f}, {1:.2f}]")
    lines += summary.table("tau by category", "tau", "{:.2f}")
    if "tau" in plots:
        lines += ["## tau vs speedup", "",
                  "tau counts target forwards saved; speedup also pays for drafting and longer verify "
                  "forwards, so the two can rank methods differently (a high-tau method with an expensive "
                  "drafter may be slower than a low-tau free one).", ""]
        lines += image("tau", "tau vs speedup") + _rank_table(summary)
    if "position" in plots:
        lines += ["## Acceptance by draft position", "",
                  "Of the steps whose draft reached position j, the share that accepted it (mean over records; "
                  "the number next to each point is how many records reached that position: a rate from few "
                  "records is noise).", ""]
        lines += image("position", "acceptance by position") + _position_table(summary)
    if "draft_length" in plots:
        lines += ["## Speedup vs draft length", ""] + image("draft_length", "speedup vs draft length")
    if any(summary.get(m, OVERALL, "predicted_speedup") for m in summary.methods):
        lines += _predicted_section(summary) + image("predicted", "predicted vs measured")
    lines += summary.table("Output equal to the baseline", "equality", "{}")
    lines += _mismatch_list(records, label)
    lines += ["## Sources", ""] + [f"- `{s}`" for s in sorted({r["_source"] for r in records})] + [""]
    return write_owned(md_path, signed_markdown("\n".join(lines), "spec-zoo-report"), "-o", REPORT_FIX, overwrite)


def ranked(summary: Summary) -> list[tuple[str, float]]:
    """The methods other than the baseline with an overall speedup, fastest first."""
    rows = [(m, summary.get(m, OVERALL, "speedup")) for m in summary.methods if m != summary.baseline]
    return sorted(((m, s) for m, s in rows if s is not None), key=lambda row: -row[1])


def _answer(summary: Summary, records: Sequence[dict], lossless: dict[str, bool | None]) -> list[str]:
    """The page's first sentence: the fastest method, how many beat the baseline, whether outputs held."""
    rows = ranked(summary)
    if not rows:
        return []
    ci = lambda m: summary.get(m, OVERALL, "speedup_ci")  # noqa: E731
    best, speed = rows[0]
    text = f"**Fastest: `{best}` at {speed:.2f}x over `{summary.baseline}`{_ci_words(ci(best))}.**"
    best_lossless = next((m for m, _ in rows if lossless.get(m) is not False), None)
    if lossless.get(best) is False and best_lossless:
        text += f" Fastest lossless: `{best_lossless}`, {_overall_speedup(summary, best_lossless)}."
    faster = sum(1 for m, _ in rows if (c := ci(m)) and c[0] > 1)
    slower = sum(1 for m, _ in rows if (c := ci(m)) and c[1] < 1)
    text += (f" Of the {len(rows)} other methods, {faster} are faster than `{summary.baseline}` with their "
             f"whole 95% CI above 1 and {slower} slower with it below 1.")
    compared = [r for r in records if r["method"] != summary.baseline and r.get("matches_baseline") is not None]
    if compared:
        equal = sum(bool(r["matches_baseline"]) for r in compared)
        text += f" {equal} of {len(compared)} compared outputs equal the baseline's."
    lossy = [m for m, _ in rows if lossless.get(m) is False]
    if lossy:
        text += f" Lossy (hatched): {', '.join(f'`{m}`' for m in lossy)}."
    return [text, ""]


def _ci_words(ci: tuple[float, float] | None) -> str:
    return f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""


def _overall_speedup(summary: Summary, method: str) -> str:
    return f"{summary.get(method, OVERALL, 'speedup'):.2f}x{_ci_words(summary.get(method, OVERALL, 'speedup_ci'))}"


def _protocol(records: Sequence[dict], note: str | None) -> list[str]:
    """How the numbers were made: the caller's note, the run's settings, and what each statistic means."""
    first = records[0]
    sources = {r["_source"] for r in records}
    return ["## Protocol", ""] + ([note, ""] if note else []) + [
        f"{len(records)} records from {len(sources)} results file(s); target `{first.get('model')}`, "
        f"dataset `{first.get('dataset')}`, machine `{first.get('machine') or first.get('platform')}`, "
        f"torch {first.get('torch_version')}, threads {first.get('threads', '?')}, "
        f"spec-zoo {first.get('spec_zoo_version')}.",
        "",
        f"Speedup: summed new tokens / summed seconds of a method over the same of `{BASELINE}` on the same "
        "prompts, measured in the same run (pooled). Spec-Bench speedup: Spec-Bench's own formula, the mean over "
        "questions of each question's tokens/s, over the baseline's (every question weighs the same). "
        "CI: 95% paired bootstrap of the pooled speedup over prompts (2,000 resamples, seeded). "
        "tau: tokens per target forward. Equal: output identical to the baseline at temperature 0 "
        f"(Spec-Bench's `equal` check); a mismatch with a top-2 logit margin below {NEAR_TIE} is a near-tie "
        "that different kernel shapes break differently, not a broken method. Lossy: the method's verifier "
        "trades exactness for speed (e.g. typical acceptance); its output is not expected to equal the baseline's.",
        "",
    ]


def _predicted_section(summary: Summary) -> list[str]:
    return ["## Predicted (cost model) vs measured", "",
            "Predicted: for tree=auto, what its cost model predicted while running (expected tokens per step "
            "over draft forwards + t(M)/t(1), recorded per run as `predicted_speedup`); for the others the "
            "classic model, tau x t_ar / (t_draft + t_ar), with t_draft the measured draft seconds per target "
            "forward and t_ar the baseline's seconds per token, assuming verifying a draft costs one plain "
            "decoding step. Error: predicted / measured - 1; measured below predicted is what scoring several "
            "tokens per forward (and the loop's own work) really costs. `spec-zoo-project` replays a traced "
            "run under a cost table (docs/trees.md).", ""] + \
        summary.table("Predicted speedup", "predicted_speedup", "{:.2f}x", level="###") + \
        summary.table("Prediction error", "prediction_error", "{:+.0%}", level="###")


def _rel(path: Path, md_path: Path) -> str:
    return path.relative_to(md_path.parent).as_posix()


def _fmt(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(*v) if isinstance(v, tuple) else fmt.format(v)


def _overall_table(summary: Summary) -> list[str]:
    lines = ["| method | speedup | 95% CI | median over repeats | Spec-Bench speedup | tau | alpha | tokens/s | "
             "equal | predicted | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in summary.methods:
        g = lambda stat, m=m: summary.get(m, OVERALL, stat)  # noqa: E731
        lines.append(
            f"| {m} | {_fmt(g('speedup'), '{:.2f}x')} | {_fmt(g('speedup_ci'), '[{0:.2f}, {1:.2f}]')} | "
            f"{_fmt(g('speedup_median'), '{:.2f}x')} | {_fmt(g('specbench_speedup'), '{:.2f}x')} | "
            f"{_fmt(g('tau'), '{:.2f}')} | {_fmt(g('alpha'), '{:.3f}')} | "
            f"{_fmt(g('tokens_per_s'), '{:.1f}')} | {_fmt(g('equality'), '{}')} | "
            f"{_fmt(g('predicted_speedup'), '{:.2f}x')} | {_fmt(g('prediction_error'), '{:+.0%}')} |")
    return lines + [""]


def _mismatch_list(records: Sequence[dict], label: Callable[[dict], str], limit: int = 40) -> list[str]:
    """Every greedy output that differs from the baseline's, with its near-tie explanation."""
    bad = [r for r in records if r.get("matches_baseline") is False]
    if not bad:
        return []
    lines = ["### Mismatches", "", "| method | question | turn | repeat | top-2 margin | explanation |",
             "|---|---|---|---|---|---|"]
    for r in bad[:limit]:
        m = r.get("top2_margin_at_mismatch")
        why = ("lossy verifier: a different text is its price, not a bug" if r.get("lossless") is False else
               "output ended early/late at the same prefix" if m is None else
               f"near-tie (margin < {NEAR_TIE}): kernel rounding, not the method" if m < NEAR_TIE else
               "clear top-1: investigate (the method changed the output)")
        lines.append(f"| {label(r)} | {r['question_id']} | {r['turn']} | {r['repeat']} | "
                     f"{'-' if m is None else f'{m:.3g}'} | {why} |")
    if len(bad) > limit:
        lines.append(f"| ... | {len(bad) - limit} more | | | | |")
    return lines + [""]


def _position_table(summary: Summary, width: int = 8) -> list[str]:
    rows = [(m, summary.get(m, OVERALL, "accept_per_position")) for m in summary.methods]
    rows = [(m, c) for m, c in rows if c]
    depth = min(width, max(len(c) for _, c in rows))
    lines = ["| method | " + " | ".join(f"pos {j + 1}" for j in range(depth)) + " |", "|---" * (depth + 1) + "|"]
    lines += [f"| {m} | " + " | ".join(f"{c[j]:.2f}" if j < len(c) else "-" for j in range(depth)) + " |"
              for m, c in rows]
    return lines + [""]


def _rank_table(summary: Summary) -> list[str]:
    ms = [m for m in summary.methods if summary.get(m, OVERALL, "tau") is not None
          and summary.get(m, OVERALL, "speedup") is not None]
    by_tau = sorted(ms, key=lambda m: -summary.get(m, OVERALL, "tau"))
    by_speed = sorted(ms, key=lambda m: -summary.get(m, OVERALL, "speedup"))
    lines = ["| rank | by tau | by speedup |", "|---|---|---|"]
    lines += [f"| {i + 1} | {a} | {b} |" for i, (a, b) in enumerate(zip(by_tau, by_speed))]
    differ = by_tau != by_speed
    return lines + ["", "The rankings differ." if differ else "Here both rank the methods alike.", ""]


SMALL_SAMPLE = 30  # prompts below which a figure says its CIs are wide


@dataclass
class RunContext:
    """What every figure's title says about the data behind it."""

    subtitle: str  # n prompts, target, temperature, threads
    small: str | None  # the small-sample warning, or None


def run_context(records: Sequence[dict]) -> RunContext:
    def values(key: str) -> str:
        found = sorted({str(r.get(key)) for r in records if r.get(key) is not None})
        return "/".join(found) if found else "?"

    prompts = len({(r.get("question_id"), r.get("turn"), r.get("_source")) for r in records})
    subtitle = (f"n={prompts} prompts, target {values('model')}, T={values('temperature')}, "
                f"{values('threads')} thread(s)")
    small = (f"small sample: {prompts} prompts (< {SMALL_SAMPLE}); confidence intervals are wide and "
             "rankings may not hold" if prompts < SMALL_SAMPLE else None)
    return RunContext(subtitle, small)


def _titled(ax: Axes, title: str, context: RunContext) -> None:
    """Title with the data's context line, and the small-sample warning in red on the plot."""
    ax.set_title(f"{title}\n{context.subtitle}", fontsize=9)
    if context.small:
        ax.text(0.01, 0.99, "small sample: CIs are wide", transform=ax.transAxes, color="red", fontsize=8,
                va="top", ha="left")


def _around(ax: Axes, values: Sequence[float | None], axis: str = "y", include: Sequence[float] = (1.0,),
            pad: float = 0.08) -> None:
    """Axis limits around the data (and the reference values), not from 0."""
    vals = [v for v in [*values, *include] if v is not None]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    margin = max(hi - lo, 0.05) * pad
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo - margin, hi + margin)


#: the widest figure, in inches: 880 px at DPI, so a docs page (~700 px of content) shrinks its text little
WIDE = 8.0
DPI = 110
#: how each bar is drawn, by the record's ``lossless`` (None: a transformers reference, not a spec-zoo verifier)
VERIFIER_STYLE: dict[bool | None, tuple[str, str, str]] = {
    True: ("lossless", "#4477aa", ""),
    False: ("lossy (verifier trades exactness for speed)", "#ee7733", "//"),
    None: ("transformers reference", "#aaaaaa", ".."),
}


@dataclass
class FigureData:
    """What the figures read: the summary, its records and their row labels, where to write."""

    summary: Summary
    records: Sequence[dict]
    label: Callable[[dict], str]
    fig_dir: Path
    context: RunContext

    @cached_property
    def methods(self) -> list[str]:
        """The rows other than the baseline, in the summary's order."""
        return [m for m in self.summary.methods if m != self.summary.baseline]

    @cached_property
    def lossless(self) -> dict[str, bool | None]:
        """Each row's ``lossless`` as its records say (False when any record of the row is lossy)."""
        flags: dict[str, bool | None] = {}
        for r in self.records:
            row, flag = self.label(r), r.get("lossless")
            flags[row] = False if False in (flags.get(row), flag) else flags.get(row, flag)
        return flags

    def overall(self, method: str, stat: str) -> Any:
        return self.summary.get(method, OVERALL, stat)


def _plots(data: FigureData) -> dict[str, Path]:
    """Every figure the data supports, by key (a figure returns None when there is nothing to draw)."""
    data.fig_dir.mkdir(parents=True, exist_ok=True)
    drawn = {key: draw(data) for key, draw in FIGURES.items()}
    return {key: path for key, path in drawn.items() if path is not None}


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only backend (imported here: the CLI starts faster without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(width: float, height: float) -> tuple[Figure, Axes]:
    return _pyplot().subplots(figsize=(width, height))


def _baseline_line(ax: Axes, axis: str = "y") -> None:
    """The baseline's speedup, 1.0, as a dashed line across the plot."""
    (ax.axhline if axis == "y" else ax.axvline)(1.0, color="k", lw=0.8, ls="--", label=f"baseline ({BASELINE}) = 1")


def _finish(fig: Figure, ax: Axes, data: FigureData, title: str, name: str, legend: bool = True) -> Path:
    """Title with the data's context, a legend, tight layout, saved as ``name``.png."""
    _titled(ax, title, data.context)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, data.fig_dir / f"{name}.png")


def _labelled_points(ax: Axes, points: Sequence[tuple[str, float, float]]) -> None:
    """One dot per (name, x, y), its name beside it: left of the dot in the right half (so it stays
    inside the plot), a line lower for each earlier dot it would cover."""
    xs, ys = [x for _, x, _ in points], [y for _, _, y in points]
    near_x, near_y = 0.05 * ((max(xs) - min(xs)) or 1), 0.03 * ((max(ys) - min(ys)) or 1)
    for i, (name, x, y) in enumerate(points):
        crowd = sum(abs(x - px) < near_x and abs(y - py) < near_y for _, px, py in points[:i])
        right = x > (min(xs) + max(xs)) / 2
        ax.scatter(x, y)
        ax.annotate(name, (x, y), fontsize=7, xytext=(-4 if right else 4, 3 - 9 * crowd), textcoords="offset points",
                    ha="right" if right else "left")


def _overall_bars(data: FigureData) -> Path | None:
    """The answer: one bar per method, fastest on top, grown from the baseline's 1.0, 95% CI
    as error bars, lossless / lossy / transformers reference told apart by colour and hatch."""
    rows = ranked(data.summary)[::-1]  # barh draws bottom-up: the fastest ends on top
    if not rows:
        return None
    fig, ax = _axes(WIDE, 1.3 + 0.36 * len(rows))
    seen: list[float] = []
    for flag, style in VERIFIER_STYLE.items():
        group = [(y, m, speed) for y, (m, speed) in enumerate(rows) if data.lossless.get(m) is flag]
        seen += _speedup_bars(ax, data, group, style) if group else []
    _baseline_line(ax, axis="x")
    _around(ax, seen, axis="x", pad=0.14)
    ax.set_yticks(range(len(rows)), [m for m, _ in rows], fontsize=10)
    ax.set_xlabel(f"speedup over {BASELINE}, all prompts pooled (error bars: 95% bootstrap CI)")
    return _finish(fig, ax, data, "Speedup per method (overall)", "speedup_overall")


def _speedup_bars(ax: Axes, data: FigureData, bars: Sequence[tuple[int, str, float]],
                  style: tuple[str, str, str]) -> list[float]:
    """One legend entry's bars, (row, method, speedup) each, grown from 1.0 with their CI and
    value written at the end; returns every value drawn (for the axis limits)."""
    kind, colour, hatch = style
    ys, speeds = [y for y, _, _ in bars], [s for _, _, s in bars]
    cis = [data.overall(m, "speedup_ci") or (s, s) for _, m, s in bars]
    err = [[max(s - lo, 0) for s, (lo, _) in zip(speeds, cis)], [max(hi - s, 0) for s, (_, hi) in zip(speeds, cis)]]
    ax.barh(ys, [s - 1.0 for s in speeds], left=1.0, xerr=err, color=colour, hatch=hatch, edgecolor="white",
            capsize=3, error_kw={"lw": 0.9}, label=kind)
    for y, s, (_, hi) in zip(ys, speeds, cis):
        ax.annotate(f"{s:.2f}x", (max(hi, s, 1.0), y), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=9)
    return speeds + [v for ci in cis for v in ci]


def _category_heatmap(data: FigureData) -> Path | None:
    """Speedup of each method (rows, fastest first) in each category (columns, overall last),
    the value printed in its cell; colour diverges at the baseline's 1.0."""
    from matplotlib.colors import TwoSlopeNorm

    methods = [m for m, _ in ranked(data.summary)]
    cats = data.summary.categories
    if not methods:
        return None
    values = [[data.summary.get(m, c, "speedup") for c in cats] for m in methods]
    known = [v for row in values for v in row if v is not None]
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(known + [0.95]), vmax=max(known + [1.05]))
    cmap = _pyplot().get_cmap("RdBu")
    fig, ax = _axes(min(WIDE, 2.8 + 0.8 * len(cats)), 1.4 + 0.36 * len(methods))
    image = ax.imshow([[float("nan") if v is None else v for v in row] for row in values], cmap=cmap, norm=norm,
                      aspect="auto")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, "-" if v is None else f"{v:.2f}", ha="center", va="center", fontsize=9,
                    color="black" if v is None else _ink(cmap(norm(v))))
    if OVERALL in cats:
        ax.axvline(cats.index(OVERALL) - 0.5, color="white", lw=3)
    ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=9)
    ax.set_yticks(range(len(methods)), methods, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label(f"speedup over {BASELINE}")
    return _finish(fig, ax, data, "Speedup by method and category", "speedup_by_category", legend=False)


def _ink(rgba: tuple[float, float, float, float]) -> str:
    """White text on a dark cell, black on a light one (by the cell's luminance)."""
    red, green, blue, _ = rgba
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"


def _tau_vs_speedup(data: FigureData) -> Path | None:
    """Tokens per target forward against measured speedup: where drafting and verifying cost time."""
    pts = [(m, data.overall(m, "tau"), data.overall(m, "speedup")) for m in data.summary.methods]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if not pts:
        return None
    fig, ax = _axes(6, 4.5)
    _labelled_points(ax, pts)
    cis = [(tau, ci) for m, tau, _ in pts if (ci := data.overall(m, "speedup_ci"))]
    for tau, ci in cis:
        ax.plot([tau, tau], ci, color="gray", lw=0.8)
    ax.plot([], [], color="gray", lw=0.8, label="95% bootstrap CI of the speedup")
    _baseline_line(ax)
    taus = [p[1] for p in pts]
    ax.plot([min(taus), max(taus)], [min(taus), max(taus)], color="gray", lw=0.8, ls=":",
            label="speedup = tau (free drafting and verifying)")
    _around(ax, [p[2] for p in pts] + [v for _, ci in cis for v in ci] + taus)
    _around(ax, taus, axis="x")
    ax.set_xlabel("tau (tokens per target forward)")
    ax.set_ylabel(f"speedup over {BASELINE}")
    return _finish(fig, ax, data, "tau vs measured speedup (overall)", "tau_vs_speedup")


def _acceptance_by_position(data: FigureData) -> Path | None:
    """Acceptance rate per draft position, each point marked with how many records reached it."""
    curves = [(m, c) for m in data.methods if (c := data.overall(m, "accept_per_position"))]
    if not curves:
        return None
    fig, ax = _axes(6, 4.5)
    for m, c in curves:
        line, = ax.plot(range(1, len(c) + 1), c, marker="o", ms=3, label=m)
        for j, (rate, n) in enumerate(zip(c, _records_reaching(data.records, data.label, m, len(c)))):
            ax.annotate(str(n), (j + 1, rate), fontsize=7, color=line.get_color(), xytext=(2, 3),
                        textcoords="offset points")
    ax.set_xticks(range(1, max(len(c) for _, c in curves) + 1))
    ax.set_xlabel("draft position (numbers: records that reached it)")
    ax.set_ylabel("acceptance rate")
    _around(ax, [v for _, c in curves for v in c], include=())
    return _finish(fig, ax, data, "Acceptance by position (overall)", "acceptance_by_position")


def _speedup_vs_draft_length(data: FigureData) -> Path | None:
    """Per drafter, the speedup of its rows that fix different draft lengths (a num_draft sweep)."""
    series: dict[str, dict[str, float]] = {}
    for r in data.records:
        k = _num_draft(r)
        if k is not None and r["method"] != BASELINE:
            series.setdefault(r.get("drafter") or "?", {})[data.label(r)] = k
    series = {d: rows for d, rows in series.items() if len(set(rows.values())) > 1}
    if not series:
        return None
    fig, ax = _axes(6, 4.5)
    for drafter, rows in series.items():
        xy = [(k, v) for k, v in sorted((k, data.overall(row, "speedup")) for row, k in rows.items()) if v is not None]
        ax.plot([k for k, _ in xy], [v for _, v in xy], marker="o", label=drafter)
    _baseline_line(ax)
    _around(ax, [data.overall(row, "speedup") for rows in series.values() for row in rows])
    ax.set_xlabel("draft length (num_draft)")
    ax.set_ylabel(f"speedup over {BASELINE}")
    return _finish(fig, ax, data, "Speedup vs draft length", "speedup_vs_draft_length")


def _predicted_vs_measured(data: FigureData) -> Path | None:
    """The cost model's predicted speedup against the measured one, on a square plot with the diagonal."""
    pm = [(m, data.overall(m, "predicted_speedup"), data.overall(m, "speedup")) for m in data.methods]
    pm = [p for p in pm if p[1] is not None and p[2] is not None]
    if not pm:
        return None
    fig, ax = _axes(5, 5)
    vals = [v for p in pm for v in p[1:]]
    _around(ax, vals)
    _around(ax, vals, axis="x")
    low, high = ax.get_xlim()
    ax.plot([low, high], [low, high], color="k", lw=0.8, ls="--", label="measured = predicted")
    _labelled_points(ax, pm)
    ax.set_xlabel("predicted speedup (cost model)")
    ax.set_ylabel("measured speedup")
    return _finish(fig, ax, data, "Predicted vs measured", "predicted_vs_measured")


#: every figure, by the key the page places it under, in drawing order
FIGURES: dict[str, Callable[[FigureData], Path | None]] = {
    "overall": _overall_bars,
    "speedup": _category_heatmap,
    "tau": _tau_vs_speedup,
    "position": _acceptance_by_position,
    "draft_length": _speedup_vs_draft_length,
    "predicted": _predicted_vs_measured,
}


def _records_reaching(records: Sequence[dict], label: Callable[[dict], str], row: str, depth: int) -> list[int]:
    """For each draft position up to ``depth``: how many of ``row``'s records drafted that far."""
    lengths = [len(r.get("accept_per_position") or []) for r in records if label(r) == row]
    return [sum(n > j for n in lengths) for j in range(depth)]


def _save(fig: Figure, path: Path) -> Path:
    """Atomically, signed (a PNG text chunk), so a later report replaces this figure and no other."""
    save_figure(fig, path, DPI)
    _pyplot().close(fig)
    return path
