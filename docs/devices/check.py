"""Every shipped drafter on one device and dtype: does greedy speculation still equal plain decoding,
and how fast is it? Issue 25's leg "the eager runtime runs on CUDA in bf16", prepared so a lent GPU
window goes to measuring (docs/devices.md); tests/test_models.py runs it here on
the CPU so it keeps working.

    python docs/devices/check.py --device cuda --dtype bfloat16 --out cuda_bf16.json
    python docs/devices/check.py --device-map auto --dtype bfloat16 --out map_auto.json

In bf16 a scored draft and a one-token step may round differently, so a mismatch counts as a near tie
(not a bug) when the target's top-2 logits at the first differing token are within ``--near-tie``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DRAFTERS = ("none", "ngram", "suffix", "lookahead", "early_exit", "small_model", "distilled", "eagle", "medusa",
            "hydra", "mlp_speculator", "parallel")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device-map", default=None, help="transformers' device_map (replaces --device)")
    p.add_argument("--model", default=None, help="a model dir (default: the embedded SmolLM2-135M)")
    p.add_argument("--drafters", default=",".join(DRAFTERS))
    p.add_argument("--prompts", type=int, default=6, help="Spec-Bench questions, one per category")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--near-tie", type=float, default=0.5, help="logit margin under which a mismatch is a near tie")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    import torch

    from spec_zoo import SpeculativeDecoder, generate
    from spec_zoo.bench.dataset import load_questions
    from spec_zoo.bench.runner import first_difference, top2_margin
    from spec_zoo.models import load_target

    target = load_target(path=args.model, dtype=args.dtype, device=args.device, device_map=args.device_map)
    plain = SpeculativeDecoder(target)
    questions = load_questions(per_category=1)[: args.prompts]
    prompts = [plain.encode(q.turns[0]) for q in questions]
    results = {"device": str(target.device), "dtype": args.dtype, "device_map": args.device_map,
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
               "torch": torch.__version__, "tokens": args.tokens, "drafters": {}}
    reference = None
    for name in args.drafters.split(","):
        row: dict = {"equal": 0, "near_tie": 0, "differs": 0, "new_tokens": 0, "seconds": 0.0, "forwards": 0}
        try:
            outputs = []
            for prompt in prompts:
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                out = generate(prompt, drafter=name, model=target, max_new_tokens=args.tokens)
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
                row["seconds"] += time.perf_counter() - start
                row["new_tokens"] += len(out.ids)
                row["forwards"] += out.stats.target_forwards
                outputs.append(out.ids)
            reference = reference or outputs  # "none" runs first: plain decoding
            for prompt, ours, theirs in zip(prompts, outputs, reference):
                at = first_difference(ours, theirs)
                if at is None:
                    row["equal"] += 1
                elif top2_margin(target, prompt + theirs[:at]) < args.near_tie:  # itself under no_grad
                    row["near_tie"] += 1
                else:
                    row["differs"] += 1
            row["tokens_per_s"] = round(row["new_tokens"] / row["seconds"], 1)
            row["tau"] = round(row["new_tokens"] / max(row["forwards"], 1), 2)
        except Exception as err:  # a drafter that fails here is this check's finding: record it, go on
            row = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        results["drafters"][name] = row
        print(name, json.dumps(row), flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return int(any("error" in r or r["differs"] for r in results["drafters"].values()))


if __name__ == "__main__":
    sys.exit(main())
