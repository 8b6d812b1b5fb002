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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spec_zoo.bench.records import BASELINE, check_schema, method_label, read_records, unique_records
from spec_zoo.bench.summary import NEAR_TIE, OVERALL, Summary, summarize
from spec_zoo.errors import ConfigError

#: run-level fields that tell configurations of one method apart (shown when they differ)
RUN_FIELDS = (("model", "model"), ("temperature", "T"), ("max_new_tokens", "max_new"), ("dataset", "dataset"))


def find_results(paths: Sequence) -> list[Path]:
    """The results files named by ``paths``: files as given, directories searched
    recursively for ``results.jsonl``."""
    found = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(p.rglob("results.jsonl"))
        else:
            raise ConfigError(f"paths: {p} does not exist; pass results.jsonl files or directories holding them.")
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
            warnings.warn(duplicates)
        records += [{**r, "_source": str(file)} for r in unique]
    if not records:
        raise ConfigError(f"paths: the results files under {', '.join(map(str, paths))} hold no records yet; "
                          "let spec-zoo-bench finish at least one question.")
    return records


def labeller(records: Sequence[dict]):
    """``label(record)``: the method, plus whatever differs between configurations of it."""
    variants: dict[str, dict] = {}
    for r in records:
        variants.setdefault(r["method"], {})[r["config_hash"]] = r
    varying: dict[str, list] = {}
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


def _num_draft(r: dict):
    params = r.get("params") or {}
    for key in ("num_draft", "prompt_lookup_num_tokens", "num_assistant_tokens"):
        if isinstance(params.get(key), (int, float)):
            return params[key]
    return None


def build_report(paths: Sequence, out_dir, title: str = "Benchmark report", seed: int = 0,
                 figures: bool = True, note: str | None = None) -> Path:
    """Write ``out_dir/report.md`` (or the file ``out_dir`` when it ends in .md) and its
    figures (``figures/`` next to it); return the markdown path."""
    records = load_results(paths)
    label = labeller(records)
    summary = summarize(records, label=label, seed=seed)
    out = Path(out_dir)
    md_path = out if out.suffix == ".md" else out / "report.md"
    fig_dir = md_path.parent / "figures"
    md_path.parent.mkdir(parents=True, exist_ok=True)

    sources = sorted({r["_source"] for r in records})
    first = records[0]
    lines = [f"# {title}", ""] + ([note, ""] if note else [])
    lines += [f"> warning: {w}" for w in summary.warnings]
    context = run_context(records)
    if context.small:
        lines += [f"> warning: {context.small}", ""]
    lines += [
        f"{len(records)} records from {len(sources)} results file(s); target `{first.get('model')}`, "
        f"dataset `{first.get('dataset')}`, machine `{first.get('machine') or first.get('platform')}`, "
        f"torch {first.get('torch_version')}, threads {first.get('threads', '?')}, "
        f"spec-zoo {first.get('spec_zoo_version')}.",
        "",
        f"Speedup: summed new tokens / summed seconds of a method over the same of `{BASELINE}` on the same "
        "prompts, measured in the same run (pooled). Spec-Bench speedup: Spec-Bench's own formula, the mean over "
        "questions of each question's tokens/s, over the baseline's (every question weighs the same). "
        "CI: 95% paired bootstrap of the pooled speedup over prompts (2,000 resamples, seeded). tau: tokens per target forward. Equal: output identical to the baseline at temperature 0 "
        f"(Spec-Bench's `equal` check); a mismatch with a top-2 logit margin below {NEAR_TIE} is a near-tie "
        "that different kernel shapes break differently, not a broken method.",
        "",
    ]
    plots = _plots(summary, records, label, fig_dir, context) if figures else {}
    overall = _overall_table(summary)
    lines += ["## Overall", ""] + overall
    if "speedup" in plots:
        lines += [f"![speedup by method and category]({_rel(plots['speedup'], md_path)})", ""]
    lines += summary.table("Speedup by category", "speedup", "{:.2f}x")
    lines += summary.table("Speedup 95% CI by category", "speedup_ci", "[{0:.2f}, {1:.2f}]")
    lines += summary.table("tau by category", "tau", "{:.2f}")
    if "tau" in plots:
        lines += ["## tau vs speedup", "",
                  "tau counts target forwards saved; speedup also pays for drafting and longer verify "
                  "forwards, so the two can rank methods differently (a high-tau method with an expensive "
                  "drafter may be slower than a low-tau free one).", "",
                  f"![tau vs speedup]({_rel(plots['tau'], md_path)})", ""]
        lines += _rank_table(summary)
    if "position" in plots:
        lines += ["## Acceptance by draft position", "",
                  "Of the steps whose draft reached position j, the share that accepted it (mean over records; "
                  "the number next to each point is how many records reached that position: a rate from few "
                  "records is noise).", "",
                  f"![acceptance by position]({_rel(plots['position'], md_path)})", ""]
        lines += _position_table(summary)
    if "draft_length" in plots:
        lines += ["## Speedup vs draft length", "", f"![speedup vs draft length]({_rel(plots['draft_length'], md_path)})", ""]
    if any(summary.get(m, OVERALL, "predicted_speedup") for m in summary.methods):
        lines += ["## Predicted (cost model) vs measured", "",
                  "Predicted: for tree=auto, what its cost model predicted while running (expected tokens per step "
                  "over draft forwards + t(M)/t(1), recorded per run as `predicted_speedup`); for the others the "
                  "classic model, tau x t_ar / (t_draft + t_ar), with t_draft the measured draft seconds per target "
                  "forward and t_ar the baseline's seconds per token, assuming verifying a draft costs one plain "
                  "decoding step. Error: predicted / measured - 1; measured below predicted is what scoring several "
                  "tokens per forward (and the loop's own work) really costs. `spec-zoo-project` replays a traced "
                  "run under a cost table (docs/trees.md).", ""]
        lines += summary.table("Predicted speedup", "predicted_speedup", "{:.2f}x", level="###")
        lines += summary.table("Prediction error", "prediction_error", "{:+.0%}", level="###")
        if "predicted" in plots:
            lines += [f"![predicted vs measured]({_rel(plots['predicted'], md_path)})", ""]
    lines += summary.table("Output equal to the baseline", "equality", "{}")
    lines += _mismatch_list(records, label)
    lines += ["## Sources", ""] + [f"- `{s}`" for s in sources] + [""]
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return md_path


def _rel(path: Path, md_path: Path) -> str:
    return path.relative_to(md_path.parent).as_posix()


def _fmt(v, fmt):
    return "-" if v is None else fmt.format(*v) if isinstance(v, tuple) else fmt.format(v)


def _overall_table(summary: Summary) -> list[str]:
    lines = ["| method | speedup | 95% CI | median over repeats | Spec-Bench speedup | tau | alpha | tokens/s | "
             "equal | predicted | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in summary.methods:
        g = lambda stat: summary.get(m, OVERALL, stat)  # noqa: E731
        lines.append(
            f"| {m} | {_fmt(g('speedup'), '{:.2f}x')} | {_fmt(g('speedup_ci'), '[{0:.2f}, {1:.2f}]')} | "
            f"{_fmt(g('speedup_median'), '{:.2f}x')} | {_fmt(g('specbench_speedup'), '{:.2f}x')} | "
            f"{_fmt(g('tau'), '{:.2f}')} | {_fmt(g('alpha'), '{:.3f}')} | "
            f"{_fmt(g('tokens_per_s'), '{:.1f}')} | {_fmt(g('equality'), '{}')} | "
            f"{_fmt(g('predicted_speedup'), '{:.2f}x')} | {_fmt(g('prediction_error'), '{:+.0%}')} |")
    return lines + [""]


def _mismatch_list(records, label, limit: int = 40) -> list[str]:
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


def run_context(records) -> RunContext:
    def values(key):
        found = sorted({str(r.get(key)) for r in records if r.get(key) is not None})
        return "/".join(found) if found else "?"

    prompts = len({(r.get("question_id"), r.get("turn"), r.get("_source")) for r in records})
    subtitle = (f"n={prompts} prompts, target {values('model')}, T={values('temperature')}, "
                f"{values('threads')} thread(s)")
    small = (f"small sample: {prompts} prompts (< {SMALL_SAMPLE}); confidence intervals are wide and "
             "rankings may not hold" if prompts < SMALL_SAMPLE else None)
    return RunContext(subtitle, small)


def _titled(ax, title: str, context: RunContext) -> None:
    """Title with the data's context line, and the small-sample warning in red on the plot."""
    ax.set_title(f"{title}\n{context.subtitle}", fontsize=9)
    if context.small:
        ax.text(0.01, 0.99, "small sample: CIs are wide", transform=ax.transAxes, color="red", fontsize=8,
                va="top", ha="left")


def _around(ax, values, axis: str = "y", include=(1.0,), pad: float = 0.08) -> None:
    """Axis limits around the data (and the reference values), not from 0."""
    vals = [v for v in [*values, *include] if v is not None]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    margin = max(hi - lo, 0.05) * pad
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo - margin, hi + margin)


def _plots(summary: Summary, records, label, fig_dir: Path, context: RunContext | None = None) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig_dir.mkdir(parents=True, exist_ok=True)
    context = context or run_context(records)
    out = {}
    methods = [m for m in summary.methods if m != BASELINE]
    cats = summary.categories

    # speedup by method x category, bars with CI
    if methods:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(methods)) ** 0.5 + 3), 4.5))
        width = 0.8 / len(methods)
        x = np.arange(len(cats))
        seen = []
        for i, m in enumerate(methods):
            vals = [summary.get(m, c, "speedup") or 1.0 for c in cats]
            cis = [summary.get(m, c, "speedup_ci") for c in cats]
            err = np.clip(np.array([[v - ci[0], ci[1] - v] if ci else [0, 0] for v, ci in zip(vals, cis)]).T, 0, None)
            # bars grow from the baseline (1.0), so faster and slower read as up and down
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, np.array(vals) - 1.0, width, bottom=1.0, yerr=err,
                   capsize=2, label=m, error_kw={"lw": 0.8})
            seen += vals + [ci[j] for ci in cis if ci for j in (0, 1)]
        ax.axhline(1.0, color="k", lw=0.8, ls="--", label=f"baseline ({BASELINE}) = 1")
        _around(ax, seen)
        ax.set_xticks(x, cats, rotation=20, ha="right")
        ax.set_ylabel(f"speedup over {BASELINE} (error bars: 95% bootstrap CI)")
        _titled(ax, "Speedup by category", context)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out["speedup"] = _save(fig, fig_dir / "speedup_by_category.png")

    # tau vs speedup
    pts = [(m, summary.get(m, OVERALL, "tau"), summary.get(m, OVERALL, "speedup")) for m in summary.methods]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if pts:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for m, tau, sp in pts:
            ax.scatter(tau, sp)
            ci = summary.get(m, OVERALL, "speedup_ci")
            if ci:
                ax.plot([tau, tau], ci, color="gray", lw=0.8)
            ax.annotate(m, (tau, sp), fontsize=7, xytext=(3, 3), textcoords="offset points")
        cis = [c for m, _, _ in pts if (c := summary.get(m, OVERALL, "speedup_ci"))]
        ax.plot([], [], color="gray", lw=0.8, label="95% bootstrap CI of the speedup")
        ax.axhline(1.0, color="k", lw=0.8, ls="--", label=f"baseline ({BASELINE}) = 1")
        taus = [p[1] for p in pts]
        ax.plot([min(taus), max(taus)], [min(taus), max(taus)], color="gray", lw=0.8, ls=":",
                label="speedup = tau (free drafting and verifying)")
        _around(ax, [p[2] for p in pts] + [v for c in cis for v in c] + taus)
        _around(ax, taus, axis="x", include=(1.0,))
        ax.legend(fontsize=7)
        ax.set_xlabel("tau (tokens per target forward)")
        ax.set_ylabel(f"speedup over {BASELINE}")
        _titled(ax, "tau vs measured speedup (overall)", context)
        fig.tight_layout()
        out["tau"] = _save(fig, fig_dir / "tau_vs_speedup.png")

    # acceptance by position
    curves = [(m, summary.get(m, OVERALL, "accept_per_position")) for m in methods]
    curves = [(m, c) for m, c in curves if c]
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for m, c in curves:
            line, = ax.plot(range(1, len(c) + 1), c, marker="o", ms=3, label=m)
            reached = _records_reaching(records, label, m, len(c))
            for j, (rate, n) in enumerate(zip(c, reached)):
                ax.annotate(str(n), (j + 1, rate), fontsize=7, color=line.get_color(), xytext=(2, 3),
                            textcoords="offset points")
        ax.set_xticks(range(1, max(len(c) for _, c in curves) + 1))
        ax.set_xlabel("draft position (numbers: records that reached it)")
        ax.set_ylabel("acceptance rate")
        _around(ax, [v for _, c in curves for v in c], include=())
        _titled(ax, "Acceptance by position (overall)", context)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out["position"] = _save(fig, fig_dir / "acceptance_by_position.png")

    # speedup vs draft length: rows whose records carry a fixed draft length, per drafter
    series: dict[str, dict] = {}
    for r in records:
        k = _num_draft(r)
        if k is not None and r["method"] != BASELINE:
            series.setdefault(r.get("drafter") or "?", {})[label(r)] = k
    series = {d: pts for d, pts in series.items() if len(set(pts.values())) > 1}
    if series:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for drafter, rows in series.items():
            xy = sorted((k, summary.get(row, OVERALL, "speedup")) for row, k in rows.items())
            xy = [(k, v) for k, v in xy if v is not None]
            ax.plot([k for k, _ in xy], [v for _, v in xy], marker="o", label=drafter)
        ax.axhline(1.0, color="k", lw=0.8, ls="--", label=f"baseline ({BASELINE}) = 1")
        _around(ax, [summary.get(row, OVERALL, "speedup") for rows in series.values() for row in rows])
        ax.set_xlabel("draft length (num_draft)")
        ax.set_ylabel(f"speedup over {BASELINE}")
        _titled(ax, "Speedup vs draft length", context)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out["draft_length"] = _save(fig, fig_dir / "speedup_vs_draft_length.png")

    # predicted vs measured
    pm = [(m, summary.get(m, OVERALL, "predicted_speedup"), summary.get(m, OVERALL, "speedup")) for m in methods]
    pm = [p for p in pm if p[1] is not None and p[2] is not None]
    if pm:
        fig, ax = plt.subplots(figsize=(5, 5))
        vals = [v for p in pm for v in p[1:]] + [1.0]
        lo, hi = min(vals), max(vals)
        margin = max(hi - lo, 0.05) * 0.08
        ax.plot([lo - margin, hi + margin], [lo - margin, hi + margin], color="k", lw=0.8, ls="--",
                label="measured = predicted")
        for m, pred, meas in pm:
            ax.scatter(pred, meas)
            ax.annotate(m, (pred, meas), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlim(lo - margin, hi + margin)
        ax.set_ylim(lo - margin, hi + margin)
        ax.set_xlabel("predicted speedup (cost model)")
        ax.set_ylabel("measured speedup")
        ax.legend(fontsize=7)
        _titled(ax, "Predicted vs measured", context)
        fig.tight_layout()
        out["predicted"] = _save(fig, fig_dir / "predicted_vs_measured.png")
    return out


def _records_reaching(records, label, row: str, depth: int) -> list[int]:
    """For each draft position up to ``depth``: how many of ``row``'s records drafted that far."""
    lengths = [len(r.get("accept_per_position") or []) for r in records if label(r) == row]
    return [sum(n > j for n in lengths) for j in range(depth)]


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
