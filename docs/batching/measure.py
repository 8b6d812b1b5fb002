"""Throughput of batched decoding of the embedded target on the compiled runtime: every live request's rows
in one graph call per step (`CompiledTarget.score_batch`), at batch sizes 1..16, for plain decoding and the
methods that decode side by side. Spec-Bench's first turns (``--per-category`` of each category), greedy.
Run on an idle host, one thread, pinned:

    OMP_NUM_THREADS=1 taskset -c 0 python docs/batching/measure.py OUT [--dtype bfloat16] [--gemm amx]
        [--weights native] [--sizes 1,2,4,8,16] [--methods none ngram LABEL:OVERRIDE,...] [--per-category 3]
        [--tokens 128] [--repeats 2]

A method is a drafter's name, or a label and the config overrides it stands for, e.g.
``ngram8_fixed:drafter=ngram,drafter.num_draft=8,drafter.adaptive=false,batch_policy=drafter``
(a fixed draft of 8 scored as proposed) beside ``ngram8_goodput:drafter=ngram,drafter.num_draft=8,
drafter.adaptive=false`` (the same drafts cut by the default goodput policy). ``none`` (plain decoding) is
the baseline of the table's last column.

Each (repeat, batch size, method) run appends one JSON line to OUT/records.jsonl at once (a rerun skips
what is there), with its wall time, tokens, tokens/s and how many requests equal their batch-1 output;
then OUT/throughput.png (tokens/s against batch size, one line per method, 95 % CI over repeats) and a
table on stdout. Raw records stay out of the repository: OUT is the caller's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from spec_zoo.api import build_decoder, compose_config, load_checked_target
from spec_zoo.bench.dataset import load_questions, prompt_encoder
from spec_zoo.outputs import save_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--weights", default="dense", help="model.weights (docs/native.md)")
    parser.add_argument("--gemm", default=None, help="model.gemm (default: amx in bfloat16, inductor in float32)")
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--methods", nargs="+", default=["none", "ngram"])
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.gemm = args.gemm or ("amx" if args.dtype == "bfloat16" else "inductor")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "records.jsonl"
    done = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    settings = ["model.runtime=compiled", f"model.dtype={args.dtype}", f"model.gemm={args.gemm}",
                f"model.weights={args.weights}"]
    target = load_checked_target(compose_config(settings).model)
    sizes = [int(s) for s in args.sizes.split(",")]
    target.hold(max(sizes))  # one cache entry per request of the largest batch: one graph serves every size
    start = time.perf_counter()
    target.warm_up()
    print(f"compiled in {time.perf_counter() - start:.0f} s (cached: {target.compile_cached})", flush=True)
    decoders = {label: build_decoder(compose_config(settings + overrides), target=target)
                for label, overrides in map(method_overrides, args.methods)}
    table = next(iter(decoders.values())).cost_table
    none = "none (goodput leaves drafts as proposed; run `spec-zoo costs` with the same model settings first)"
    print(f"cost table: {none if table is None else table.machine}", flush=True)
    questions = load_questions(per_category=args.per_category)
    encode = prompt_encoder(next(iter(decoders.values())))
    prompts = [encode(q.turns[:1], []) for q in questions]
    qids = [q.question_id for q in questions]
    # row counts past the buckets compile on first sight: see them before the clock runs (the largest batch
    # first, so a compiled head holds its entries for every size at once and compiles once)
    for size in sorted(sizes, reverse=True):
        for decoder in decoders.values():
            decoder.generate_batch(prompts[:size], 8, batch_size=size, request_ids=qids[:size])
    reference: dict[str, list[list[int]]] = {}
    for repeat in range(args.repeats):
        for size in sizes:
            for method, decoder in decoders.items():
                key = {"dtype": args.dtype, "gemm": args.gemm, "method": method, "batch_size": size,
                       "repeat": repeat, "tokens": args.tokens, "prompts": len(prompts)}
                old = next((r for r in done if all(r.get(k) == v for k, v in key.items())), None)
                if old is not None:
                    reference.setdefault(method, old["ids"]) if size == 1 else None
                    continue
                t0 = time.perf_counter()
                # a question's id: drafter=suffix never drafts from that question's own earlier answers
                outs = decoder.generate_batch(prompts, args.tokens, batch_size=size, request_ids=qids)
                wall = time.perf_counter() - t0
                ids = [o.ids for o in outs]
                if size == 1:
                    reference.setdefault(method, ids)
                base = reference.get(method)
                record = key | {"wall_s": wall, "new_tokens": sum(len(i) for i in ids),
                                "tok_s": sum(len(i) for i in ids) / wall, "slots": decoder.slots(size),
                                "steps": sum(len(o.stats.steps) for o in outs),
                                "drafted": sum(s.drafted for o in outs for s in o.stats.steps),
                                "accepted": sum(s.accepted for o in outs for s in o.stats.steps),
                                "equal_to_batch_1": None if base is None else sum(a == b for a, b in zip(ids, base)),
                                "equal_to_plain": None if "none" not in reference else
                                sum(a == b for a, b in zip(ids, reference["none"])),
                                "ids": ids if size == 1 else None}
                with path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                done.append(record)
                print(f"repeat {repeat} batch {size:2d} {method:8s} {record['tok_s']:6.1f} tok/s "
                      f"({wall:.0f} s; equal to batch 1: {record['equal_to_batch_1']}/{len(prompts)}, "
                      f"to plain: {record['equal_to_plain']})", flush=True)
    report(args.out, done)


def method_overrides(spec: str) -> tuple[str, list[str]]:
    """``ngram`` -> ("ngram", ["drafter=ngram"]); ``label:a=1,b=2`` -> ("label", ["a=1", "b=2"])."""
    label, _, overrides = spec.partition(":")
    return label, overrides.split(",") if overrides else [f"drafter={label}"]


def report(out: Path, records: list[dict]) -> None:
    """The table (mean tok/s and 95 % CI over repeats, speedup over plain at the same batch size, and
    throughput over batch 1) and the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: dict[tuple[str, int], list[float]] = {}
    for r in records:
        cells.setdefault((r["method"], r["batch_size"]), []).append(r["tok_s"])
    methods = sorted({m for m, _ in cells})
    sizes = sorted({s for _, s in cells})

    def mean_ci(values: list[float]) -> tuple[float, float]:
        mean = statistics.fmean(values)
        half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        return mean, half

    print("| method | batch | tok/s (95 % CI) | x batch 1 | x plain at this batch |")
    print("|---|---|---|---|---|")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for method in methods:
        xs, ys, es = [], [], []
        for size in sizes:
            if (method, size) not in cells:
                continue
            mean, half = mean_ci(cells[method, size])
            one = statistics.fmean(cells.get((method, 1), [math.nan]))
            plain = statistics.fmean(cells.get(("none", size), [math.nan]))
            print(f"| {method} | {size} | {mean:.1f} ± {half:.1f} | {mean / one:.2f} | {mean / plain:.2f} |")
            xs.append(size), ys.append(mean), es.append(half)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests decoded at once (batch size)")
    ax.set_ylabel("tokens/s over the run")
    ax.legend()
    save_figure(fig, out / "throughput.png", dpi=120)


if __name__ == "__main__":
    main()
