"""Whole-model t(M): SmolLM2-135M on the compiled runtime in several settings (VARIANTS: `;`
between variants, `+` between a variant's model settings; or GEMMS, one model.gemm each), one
CompiledTarget each on one model in one process, every (M, variant) interleaved per round, at
each context length in PASTS; wall and thread CPU time; then row 0's logits at every M
against M = 1. docs/runtime.md, "The skinny GEMM" and "The attention kernel".

    OMP_NUM_THREADS=1 GEMMS=skinny,inductor PASTS=100,500,1500 R=5 python docs/runtime/skinny_costs.py
    OMP_NUM_THREADS=1 VARIANTS="attention=inductor;attention=kernel" PASTS=100,500,1500 R=3 \
        OUT=docs/runtime/attention_costs.json python docs/runtime/skinny_costs.py
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from spec_zoo.draft import Draft
from spec_zoo.models import load_target, on_runtime

ROWS = list(range(1, 17)) + [32]


def chain(m: int, vocab: int) -> Draft:
    return Draft.chain([(3 * j) % vocab for j in range(m - 1)])


def measure(targets: dict, past: int, rounds: int, vocab: int) -> dict:
    prompt = [(7 * i) % vocab for i in range(past + 1)]
    for target in targets.values():
        target.reset()
        target.score(prompt, Draft.empty())
    clocks = {"wall": time.perf_counter, "cpu": time.thread_time}
    samples = {(g, c, m): [] for g in targets for c in clocks for m in ROWS}
    loads = [os.getloadavg()]
    with torch.no_grad():
        for r in range(rounds + 1):  # round 0 warms every shape
            for m in ROWS:
                for g, target in targets.items():
                    target.rewind(prompt)
                    wall, cpu = time.perf_counter(), time.thread_time()
                    target.score(prompt, chain(m, vocab))
                    if r:
                        samples[(g, "wall", m)].append(time.perf_counter() - wall)
                        samples[(g, "cpu", m)].append(time.thread_time() - cpu)
            loads.append(os.getloadavg())
    ms = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
    print(f"{past} cached tokens, {rounds} rounds; load average per round: {loads}")
    for c in clocks:
        print(f"clock={c}: M | " + " | ".join(f"{g} ms (t(M)/t(1))" for g in targets))
        for m in ROWS:
            print(f"{m} | " + " | ".join(f"{ms[(g, c, m)]:.1f} ({ms[(g, c, m)] / ms[(g, c, 1)]:.2f})" for g in targets))
    for g, target in targets.items():
        target.rewind(prompt)
        alone = target.score(prompt, Draft.empty()).logits[0]
        worst = 0.0
        for m in ROWS:
            target.rewind(prompt)
            worst = max(worst, (target.score(prompt, chain(m, vocab)).logits[0] - alone).abs().max().item())
        print(f"{g}: largest |row 0 at M - row 0 at M = 1|, M = 1..16, 32: {worst}")
    return {"past": past, "rounds": rounds, "loads": loads, "ms": {f"{g}/{c}/{m}": v for (g, c, m), v in ms.items()}}


def main():
    torch.set_num_threads(1)
    base = load_target("smollm2-135m")
    variants = os.environ.get("VARIANTS") or ";".join(
        f"gemm={g}" for g in os.environ.get("GEMMS", "skinny,inductor").split(","))
    targets = {}
    for variant in variants.split(";"):
        settings = dict(pair.split("=") for pair in variant.split("+"))
        targets[variant] = on_runtime("compiled", base.model, base.tokenizer, fallback=False, **settings)
        print(variant, "compiled in", targets[variant].warm_up(), "s", file=sys.stderr, flush=True)
    records = [measure(targets, int(p), int(os.environ.get("R", 5)), base.vocab_size)
               for p in os.environ.get("PASTS", "100").split(",")]
    if "OUT" in os.environ:
        Path(os.environ["OUT"]).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
