"""Tables and the plot of docs/suffix/report.md from the bench records in docs/suffix/*/.

    python docs/suffix/report.py

Reads results.jsonl.gz of the repetitive track (docs/suffix/repetitive/) and of the Spec-Bench
sample (docs/suffix/spec_bench/); writes gain.png (suffix's tau over ngram's against the
number of earlier requests the suffix cache has seen) and the tables (tau per category, and
the suffix cache's memory after N requests, replayed from the suffix method's own outputs in
run order, unbounded and under a small bound) into report.md, under HEADER.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spec_zoo.drafters.suffix import SuffixCache

HERE = Path(__file__).parent
HEADER = """# Suffix decoding: the repetitive track and a Spec-Bench sample

SmolLM2-135M (the embedded target), eager runtime, greedy, one thread, on this project's
shared CPU. Only tau (tokens per target forward) is reported: it does not depend on the
machine's load, wall-clock speed does. `ar` is plain decoding (tau 1). Written by
`python docs/suffix/report.py` from the records beside it, measured with:

```bash
OMP_NUM_THREADS=1 spec-zoo-bench 'methods=[ngram,suffix]' dataset=repetitive \\
    'dataset.categories=[extraction]' dataset.per_category=16 generation.max_new_tokens=64 out=docs/suffix/repetitive
OMP_NUM_THREADS=1 spec-zoo-bench 'methods=[ngram,suffix,lookahead]' dataset.per_category=1 \\
    generation.max_new_tokens=32 out=docs/suffix/spec_bench
```

Suffix reads, for each request, the outputs of the requests run before it (in question-id
order); the first request has none. Each request's tau is its own records' new tokens over
target forwards; "pooled" sums both over requests. One caveat on load-independence: `ngram`
chooses its draft length by expected speedup with the step cost fitted online from step
times (`learn_cost`, greedy runs), so its drafting, and with it its tau, depends somewhat
on the machine's load; `suffix` and `lookahead` read no clock. On the repetitive track ngram
drafted 390 tokens and had 68 accepted, suffix 967 and 459 (853 new tokens each).

Not measured here (CPU time on a shared machine): the issue's Spec-Bench protocol (5 per
category, 128 tokens, repeats 3, compiled runtime, against `ar_compiled`, `ngram_compiled`,
`eagle_compiled`, `medusa_compiled`), the `cascade` on the repetitive track, the editing
category of the repetitive track, and any speed.
"""


def records(track: str) -> list[dict]:
    """The track's records of the (question, turn)s every method has measured (a run
    stopped early leaves its last question part-measured)."""
    path = HERE / track / "results.jsonl.gz"
    text = gzip.decompress(path.read_bytes()).decode() if path.is_file() else ""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    methods = {r["method"] for r in rows}
    done = {}
    for r in rows:
        done.setdefault((r["question_id"], r["turn"]), set()).add(r["method"])
    return [r for r in rows if done[(r["question_id"], r["turn"])] == methods]


def pooled_tau(rows: list[dict]) -> float:
    return sum(r["new_tokens"] for r in rows) / sum(r["target_forwards"] for r in rows)


def tau_table(rows: list[dict], title: str) -> list[str]:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    categories = list(dict.fromkeys(r["category"] for r in rows))
    lines = [f"### {title}", "", "| category | requests | " + " | ".join(f"tau {m}" for m in methods)
             + " | suffix / ngram |", "|---" * (len(methods) + 3) + "|"]
    for category in categories + ["overall"]:
        pick = [r for r in rows if category in ("overall", r["category"])]
        taus = {m: pooled_tau([r for r in pick if r["method"] == m]) for m in methods}
        n = sum(1 for r in pick if r["method"] == methods[0])
        lines.append(f"| {category} | {n} | " + " | ".join(f"{taus[m]:.2f}" for m in methods)
                     + f" | {taus['suffix'] / taus['ngram']:.2f}x |")
    identical = all(r["matches_baseline"] for r in rows if r["method"] != "ar")
    return lines + ["", f"Every output identical to plain greedy decoding: {identical}.", ""]


def gain_plot(rows: list[dict], path: Path) -> list[str]:
    ngram = [r for r in rows if r["method"] == "ngram"]
    suffix = [r for r in rows if r["method"] == "suffix"]
    seen = list(range(len(suffix)))  # requests (turns) the suffix cache holds before this one
    ratio = [s["tau"] / n["tau"] for s, n in zip(suffix, ngram)]
    running = [pooled_tau(suffix[: i + 1]) / pooled_tau(ngram[: i + 1]) for i in seen]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(seen, ratio, "o", ms=4, alpha=0.6, label="this request")
    ax.plot(seen, running, "-", label="pooled over requests so far")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("earlier requests in the suffix cache")
    ax.set_ylabel("tau(suffix) / tau(ngram)")
    ax.set_title("Repetitive track, SmolLM2-135M, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    blocks = [(0, 1), (1, 5), (5, 10), (10, 20), (20, len(suffix))]
    lines = ["| earlier requests seen | requests | tau suffix | tau ngram | suffix / ngram |", "|---|---|---|---|---|"]
    for lo, hi in blocks:
        if lo < len(suffix):
            s, n = pooled_tau(suffix[lo:hi]), pooled_tau(ngram[lo:hi])
            end = min(hi, len(suffix))
            lines.append(f"| {lo}-{end - 1} | {end - lo} | {s:.2f} | {n:.2f} | {s / n:.2f}x |")
    return lines + [""]


def memory_table(rows: list[dict], bound: tuple[int, int] | None) -> list[str]:
    outputs = [r["output_ids"] for r in rows if r["method"] == "suffix"]
    checkpoints = sorted({n for n in (1, 2, 4, 6, 8, 10, 16, 20, 30, len(outputs)) if n <= len(outputs)})
    tracemalloc.start()
    cache = SuffixCache(*bound) if bound else SuffixCache()
    lines = ["| requests added | outputs held | tokens held | index entries | bytes (getsizeof estimate) "
             "| bytes (tracemalloc) |",
             "|---|---|---|---|---|---|"]
    for n, ids in enumerate(outputs, 1):
        cache.add(ids, source=n, key=n)
        if bound:
            assert len(cache) <= bound[0] and cache.tokens <= bound[1]
        if n in checkpoints:
            m = cache.memory()
            traced, _ = tracemalloc.get_traced_memory()
            lines.append(f"| {n} | {m['requests']} | {m['tokens']} | {m['index_entries']} | {m['bytes']:,} "
                         f"| {traced:,} |")
    tracemalloc.stop()
    return lines + [""]


def main() -> None:
    repetitive, spec_bench = records("repetitive"), records("spec_bench")
    out = [HEADER]
    out += tau_table(repetitive, "Repetitive track (dataset=repetitive)")
    if spec_bench:
        out += tau_table(spec_bench, "Spec-Bench sample (dataset.per_category=1)")
    out += ["### Gain against the requests seen (repetitive track)", "", "![gain](gain.png)", ""]
    out += gain_plot(repetitive, HERE / "gain.png")
    out += ["### Suffix cache memory after N requests (default bounds: 1000 outputs, 200,000 tokens)", ""]
    out += memory_table(repetitive, None)
    out += ["### The same under a small bound (max_requests=4, max_tokens=200; checked after every add)", ""]
    out += memory_table(repetitive, (4, 200))
    (HERE / "report.md").write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()
