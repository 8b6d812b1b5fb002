"""``spec-zoo-bench batches=DIR``: throughput and speedup against batch size, from a sweep's results.

A sweep (``spec-zoo-bench -m batch_size=1,2,4,8,16 out=DIR``) leaves one results file per batch
size under DIR. Per method and batch size this reads them all and reports:

throughput: tokens over the batches' time, sum new_tokens / sum batch_wall_s (each batch counted
            once), the 95 % CI from its spread over repeats;
speedup:    that throughput over plain decoding's (``ar``, or the record's own ``plain`` method)
            at the same batch size, on the same questions: what speculating buys at that load;
x batch 1:  the throughput over the method's own at batch size 1;
equal:      requests whose output equals its plain method's (greedy), of those compared.

It writes DIR/batches.md (the table) and two figures beside it, one line per method.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from spec_zoo.bench.records import check_schema, method_label, read_records
from spec_zoo.errors import ConfigError
from spec_zoo.outputs import save_figure, signed_markdown, write_owned


def sweep_records(folder: Path) -> list[dict]:
    """Every record of the results files under ``folder`` (each batch size's run), checked."""
    paths = sorted(folder.rglob("results.jsonl"))
    if not paths:
        raise ConfigError(f"batches: {folder} holds no results.jsonl; pass the out= of a sweep such as "
                          "`spec-zoo-bench -m batch_size=1,2,4,8 out=DIR`.")
    return [r for p in paths for r in check_schema(read_records(p), str(p))]


def throughput_table(records: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (method label, batch size): tokens/s with its 95 % CI over repeats, the speedup over
    its plain method at that batch size, and the requests equal to plain."""
    per_repeat: dict[tuple[str, int, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    plains: dict[tuple, str] = {}
    equal: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        size = r.get("batch_size") or 1
        key = (method_label(r), size, r["method"])
        cell = per_repeat[key][r["repeat"]]
        cell[0] += r["new_tokens"]
        cell[1] += (r.get("batch_wall_s") or r["wall_s"]) / (r.get("batch_requests") or 1)
        plains[key] = r.get("plain") or "ar"
        if r.get("matches_baseline") is not None:
            equal[key][0] += bool(r["matches_baseline"])
            equal[key][1] += 1
    rates = {key: [tokens / seconds for tokens, seconds in reps.values() if seconds > 0]
             for key, reps in per_repeat.items()}
    by_method = {(key[2], key[1]): key for key in rates}  # (method, batch size) -> its key
    table = {}
    for key, values in rates.items():
        label, size, method = key
        mean = statistics.fmean(values)
        half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        plain_key = by_method.get((plains[key], size))
        one_key = by_method.get((method, 1))
        table[label, size] = {
            "tok_s": mean, "ci": half, "repeats": len(values),
            "speedup": mean / statistics.fmean(rates[plain_key]) if plain_key else None,
            "x_batch_1": mean / statistics.fmean(rates[one_key]) if one_key else None,
            "equal": equal[key] if equal[key][1] else None,
        }
    return table


def write_batches(folder: Path) -> Path:
    """The table (DIR/batches.md, printed too) and the figures of a batch-size sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sweep_records(folder)
    table = throughput_table(records)
    machines = sorted({f"{r.get('machine')} | {r.get('threads')} thread(s) | {r.get('dtype')}" for r in records})
    lines = ["# Throughput against batch size", "", *(f"- {m}" for m in machines), "",
             "| method | batch | tok/s (95 % CI) | speedup over plain at this batch | x batch 1 | equal to plain |",
             "|---|---|---|---|---|---|"]

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    for (label, size), cell in sorted(table.items()):
        eq = cell["equal"]
        lines.append(f"| {label} | {size} | {cell['tok_s']:.1f} ± {cell['ci']:.1f} | {fmt(cell['speedup'])} | "
                     f"{fmt(cell['x_batch_1'])} | {'-' if eq is None else f'{eq[0]}/{eq[1]}'} |")
    for stat, ylabel, name in (("tok_s", "tokens/s over the batches", "throughput.png"),
                               ("speedup", "speedup over plain at the same batch size", "speedup.png")):
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for label in sorted({lb for lb, _ in table}):
            points = [(s, c) for (lb, s), c in sorted(table.items()) if lb == label and c[stat] is not None]
            if points:
                ax.errorbar([s for s, _ in points], [c[stat] for _, c in points],
                            yerr=[c["ci"] for _, c in points] if stat == "tok_s" else None,
                            marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests decoded at once (batch size)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
        save_figure(fig, folder / name, dpi=120)
        lines += ["", f"![{ylabel}]({name})"]
    text = "\n".join(lines) + "\n"
    path = write_owned(folder / "batches.md", signed_markdown(text, "spec-zoo-bench"), "batches",
                       "move it away, or copy the sweep elsewhere and plot that copy")
    print(text)
    return path
