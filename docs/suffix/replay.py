"""Model-free drafters replayed on a bench run's greedy answers, priced by a cost table.

Greedy output is the target's argmax whatever was drafted, so a run's `ar` answers say what
the target would accept at every step. This script serves them from an oracle in place of the
target and runs the real decoder loop with each drafter (the n-gram and suffix drafters, or any
drafter that needs no target states), in the bench's order (question, turn, method; the suffix
cache filed per question id, as in the bench). A step that scores M tokens after c cached ones
is priced at the table's t(M) at c, plus the drafter's own measured time; plain decoding at
t(1) per token. Every replayed answer is checked equal to the recorded one.

It is a projection from measured parts (the cost table, the drafts), not a timing of the target:
use it to tune a drafter's knobs in seconds, then confirm on the bench.

    python docs/suffix/replay.py results/flat_cost --costs ~/.cache/spec_zoo/models/costs/<table>.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from spec_zoo.bench.dataset import load_questions, prompt_encoder
from spec_zoo.costs import CostTable
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.paths import cache_root
from spec_zoo.runtime.target import Scores, Target

CONF = Path(__file__).resolve().parents[2] / "conf" / "drafter"


class Oracle(Target):
    """A stand-in target whose logits put all mass on the recorded answer's next token (a
    `Target` with no model: it inherits the decode loop's batch calls, one sequence at a time)."""

    runtime, max_length, device, model = "replay", None, torch.device("cpu"), None

    def __init__(self, vocab_size: int, tokenizer=None):
        self.vocab_size, self.tokenizer = vocab_size, tokenizer
        self.full: list[int] = []

    def reset(self, slot: int = 0) -> None:
        pass

    def commit(self, path) -> None:
        pass

    def score(self, tokens, draft, hidden=False) -> Scores:
        pos, full = len(tokens), self.full
        logits = torch.zeros(len(draft) + 1, self.vocab_size)
        if pos < len(full):
            logits[0, full[pos]] = 1.0
        depth, on_path = [0] * len(draft), [False] * len(draft)
        for i, parent in enumerate(draft.parents):
            depth[i] = 1 if parent < 0 else depth[parent] + 1
            at = pos + depth[i] - 1
            on_path[i] = (parent < 0 or on_path[parent]) and at < len(full) and int(draft.tokens[i]) == full[at]
            if on_path[i] and at + 1 < len(full):
                logits[i + 1, full[at + 1]] = 1.0
        return Scores(logits, None, 0)


def drafter(spec: str):
    """``NAME`` or ``NAME:key=value,...``: conf/drafter/NAME.yaml with overrides."""
    name, _, overrides = spec.partition(":")
    dotlist = overrides.split(",") if overrides else []
    cfg = OmegaConf.merge(OmegaConf.load(CONF / f"{name}.yaml"), OmegaConf.from_dotlist(dotlist))
    return instantiate(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a bench output dir (its results.jsonl holds `ar`'s answers)")
    ap.add_argument("--costs", type=Path, required=True, help="the cost table to price steps with")
    ap.add_argument("--drafters", nargs="+", default=["ngram", "suffix", "suffix:price=false"])
    ap.add_argument("--repeat", type=int, default=0, help="which repeat's answers to replay")
    ap.add_argument("--dataset", default="spec_bench", help="the shipped dataset the run used (e.g. repetitive)")
    args = ap.parse_args()

    table = CostTable.load(args.costs)
    tokenizer = AutoTokenizer.from_pretrained(cache_root() / "smollm2-135m-instruct")
    oracle = Oracle(len(tokenizer), tokenizer)
    answers = {}
    for line in (args.run / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["method"] == "ar" and r["repeat"] == args.repeat:
            answers[(r["question_id"], r["turn"])] = list(r["output_ids"])
    questions = [q for q in load_questions(args.dataset, None, None) if (q.question_id, 1) in answers]
    decoders = {spec: SpeculativeDecoder(oracle, drafter(spec), cost_table=table) for spec in args.drafters}
    encode = prompt_encoder(next(iter(decoders.values())))
    seconds = {spec: {} for spec in ["ar", *args.drafters]}
    for q in questions:
        for turn in range(1, len(q.turns) + 1):
            if (q.question_id, turn) not in answers:
                continue
            truth = answers[(q.question_id, turn)]
            prompt = encode(q.turns[:turn], [answers[(q.question_id, t)] for t in range(1, turn)])
            oracle.full = prompt + truth
            plain = sum(table.at(len(prompt) + i).seconds[0] for i in range(1, len(truth)))
            seconds["ar"][q.category] = seconds["ar"].get(q.category, 0.0) + plain
            for spec, decoder in decoders.items():
                out = decoder.generate(prompt, max_new_tokens=len(truth), eos_token_ids=[], request_id=q.question_id)
                assert out.ids == truth, f"{spec} replayed question {q.question_id} turn {turn} differently"
                context, cost = len(prompt) + out.stats.steps[0].committed, sum(s.draft_s for s in out.stats.steps)
                for step in out.stats.steps[1:]:  # the first step reads the prompt: the same for every method
                    at = table.at(context)
                    cost += at.seconds[0] * at.relative(step.drafted + 1)
                    context += step.committed
                seconds[spec][q.category] = seconds[spec].get(q.category, 0.0) + cost
    cats = list(seconds["ar"])  # in the order the run met them
    print("| method | " + " | ".join(cats) + " | overall |")
    print("|---|" + "---|" * (len(cats) + 1))
    for spec, by_cat in seconds.items():
        cells = [seconds["ar"][c] / by_cat[c] for c in cats]
        overall = sum(seconds["ar"].values()) / sum(by_cat.values())
        print(f"| {spec} | " + " | ".join(f"{x:.2f}x" for x in cells) + f" | {overall:.2f}x |")


if __name__ == "__main__":
    main()
