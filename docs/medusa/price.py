"""Typical acceptance's price (docs/medusa.md), from `spec-zoo-bench` records: the target's
mean per-token log-likelihood (temperature 1) of each method's text, and the fraction of
turns whose text differs from plain greedy decoding's (`ar` of the greedy run).

    python docs/medusa/price.py docs/medusa/t0/results.jsonl.gz docs/medusa/t0.7/results.jsonl.gz

Each turn is scored after the conversation the method saw (its own earlier answers), as the
bench prompted it.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch

from spec_zoo import SpeculativeDecoder
from spec_zoo.bench.dataset import load_questions, prompt_encoder
from spec_zoo.bench.records import method_label, read_records
from spec_zoo.models import load_target


@torch.no_grad()
def loglik(target, prompt: list[int], out: list[int]) -> float:
    """Mean log p(token) under the target (temperature 1) over ``out``."""
    logp = target.model(input_ids=torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
    return float(logp.log_softmax(-1).gather(-1, torch.tensor(out)[:, None]).mean())


def main(paths: list[str]) -> None:
    torch.set_num_threads(1)
    target = load_target()
    encode = prompt_encoder(SpeculativeDecoder(target))
    questions = {q.question_id: q for q in load_questions()}
    records = [r for path in paths for r in read_records(path)]
    greedy = {(r["question_id"], r["turn"]): r["output_ids"] for r in records
              if r["method"] == "ar" and r["temperature"] == 0}
    answers = {(method_label(r), r["temperature"], r["question_id"], r["turn"], r["repeat"]): r["output_ids"]
               for r in records}
    rows = defaultdict(list)
    for r in records:
        key = (method_label(r), r["temperature"])
        earlier = [answers[(*key, r["question_id"], t, r["repeat"])] for t in range(1, r["turn"])]
        prompt = encode(list(questions[r["question_id"]].turns[: r["turn"]]), earlier)
        rows[key].append((loglik(target, prompt, r["output_ids"]),
                          r["output_ids"] != greedy[(r["question_id"], r["turn"])]))
    print("| method | temperature | turns | log-likelihood per token | text differs from greedy |")
    print("| --- | --- | --- | --- | --- |")
    for (method, temperature), values in rows.items():
        n = len(values)
        print(f"| {method} | {temperature:g} | {n} | {sum(v for v, _ in values) / n:.3f} | "
              f"{sum(d for _, d in values)}/{n} |")


if __name__ == "__main__":
    main(sys.argv[1:])
