"""Typical acceptance's price (docs/medusa.md): on Spec-Bench first turns, the target's mean
per-token log-likelihood (temperature 1) of the text of plain greedy decoding, exact sampling
(rejection) and typical acceptance at temperature T, and how often typical's text differs from
greedy's; tau of each. Writes one JSON line per (prompt, method) and prints the means.

    OMP_NUM_THREADS=1 python docs/medusa/price.py --per-category 2 --tokens 64 --out docs/medusa/price.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from spec_zoo import SamplingParams, SpeculativeDecoder
from spec_zoo.bench.dataset import load_questions
from spec_zoo.drafters.medusa import MedusaDrafter
from spec_zoo.models import load_target
from spec_zoo.registry import compose_option
from spec_zoo.verifiers.typical import TypicalVerifier


@torch.no_grad()
def loglik(target, prompt: list[int], out: list[int]) -> float:
    """Mean log p(token) under the target (temperature 1) over ``out``."""
    ids = torch.tensor([prompt + out])
    logp = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return float(logp.gather(-1, torch.tensor(out)[:, None]).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--epsilon", type=float, nargs="+", default=[0.09])
    ap.add_argument("--out", default="docs/medusa/price.jsonl")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = load_target()
    tree = compose_option("drafter", "medusa_tree")["choices"]
    hot = SamplingParams(temperature=a.temperature)
    methods = {"greedy": lambda: SpeculativeDecoder(target),
               "sampled": lambda: SpeculativeDecoder(target, sampling=hot),
               **{f"typical_eps{e}": (lambda e=e: SpeculativeDecoder(
                   target, MedusaDrafter(choices=tree), TypicalVerifier(e, min(1.0, e ** 0.5)), hot))
                  for e in a.epsilon}}
    decoders = {name: make() for name, make in methods.items()}
    rows = []
    for q in load_questions(per_category=a.per_category):
        prompt = decoders["greedy"].encode(q.turns[0])
        greedy = None
        for name, decoder in decoders.items():
            out = decoder.generate(prompt, a.tokens, seed=q.question_id)
            greedy = out.ids if name == "greedy" else greedy
            rows.append({"question_id": q.question_id, "category": q.category, "method": name,
                         "loglik": loglik(target, prompt, out.ids), "tau": out.stats.tau,
                         "differs_from_greedy": out.ids != greedy, "new_tokens": len(out.ids)})
            print(json.dumps(rows[-1]), flush=True)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in decoders:
        mine = [r for r in rows if r["method"] == name]
        mean = lambda k: sum(float(r[k]) for r in mine) / len(mine)  # noqa: E731
        print(f"{name}: loglik/token {mean('loglik'):.3f}, tau {mean('tau'):.2f}, "
              f"differs from greedy {mean('differs_from_greedy'):.0%} of {len(mine)} turns")


if __name__ == "__main__":
    main()
