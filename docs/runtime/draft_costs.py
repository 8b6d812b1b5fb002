# ruff: noqa: E402 (a measurement script: the thread count is set before the models load)
"""Per drafter: seconds per drafted level / compiled t(1), eager vs compiled draft, interleaved.

python draft_costs.py ROUNDS [NAMES...]: NAMES picks drafters by the start of their label
(default: all); each round's figures are printed as they come."""
import json
import os
import statistics
import sys

import torch

torch.set_num_threads(1)
from spec_zoo import SpeculativeDecoder
from spec_zoo.costs import draft_rounds
from spec_zoo.drafters.distilled import DistilledDrafter
from spec_zoo.drafters.eagle import EagleDrafter
from spec_zoo.drafters.early_exit import EarlyExitDrafter
from spec_zoo.drafters.medusa import MedusaDrafter
from spec_zoo.models import load_target
from spec_zoo.verifiers.greedy import GreedyVerifier

target = load_target(runtime="compiled")
target.warm_up()
fixed = dict(adaptive=False)
drafters = {
    "eagle (eager head)": EagleDrafter(num_draft=4, **fixed),
    "eagle (compiled head)": EagleDrafter(num_draft=4, runtime="compiled", **fixed),
    "medusa (eager heads)": MedusaDrafter(num_draft=3),
    "early_exit E=8 adapter (eager layers)": EarlyExitDrafter(8, num_draft=3, adapter="shipped", **fixed),
    "early_exit E=8 adapter (compiled draft)": EarlyExitDrafter(8, num_draft=3, adapter="shipped", reuse_kv=False,
                                                                runtime="compiled", **fixed),
    "distilled, eager draft": DistilledDrafter(num_draft=4, runtime="eager", **fixed),
    "distilled, compiled draft": DistilledDrafter(num_draft=4, runtime="compiled", **fixed),
}
names = sys.argv[2:]
drafters = {k: d for k, d in drafters.items() if not names or any(k.startswith(n) for n in names)}
decoders = {k: SpeculativeDecoder(target, d, GreedyVerifier()) for k, d in drafters.items()}
for d in drafters.values():
    for part in getattr(d, "compiled_parts", list)():
        print("draft compile", part.warm_up(), part.compile_cached, file=sys.stderr, flush=True)
prompts = [target.tokenizer(p)["input_ids"] for p in (
    "Explain how a hash map works, with an example in Python.",
    "Translate to German: The weather is nice today and we are going to the park.",
    "Write a short story about a robot who learns to paint.")]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
t1, per = draft_rounds(target, decoders, prompts, rounds, 32, said=lambda r, t1, per: print(
    r, os.getloadavg(), {k: round(v[-1] / t1[-1], 3) for k, v in per.items()}, file=sys.stderr, flush=True))
t = statistics.median(t1)
params = sum(p.numel() * p.element_size() for p in target.model.parameters())
print(json.dumps({"t1_ms": round(t * 1e3, 2), "load": os.getloadavg(), "target_bytes": params,
                  "per_level_steps": {k: [round(x / t, 3) for x in v] for k, v in per.items()},
                  "median_steps": {k: round(statistics.median(v) / t, 3) for k, v in per.items()}}, indent=1))
def nbytes(mod, skip=()):
    seen = {}
    for name, p in [*mod.named_parameters(), *mod.named_buffers()]:
        if not any(s in name for s in skip) and p.is_floating_point():
            seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())
tb = nbytes(target.model)
share = {}
for k, d in drafters.items():  # the drafter's floating-point weights over the target's
    if k.startswith("eagle"):
        share["eagle"] = nbytes(d.head) / tb
    elif k.startswith("medusa"):
        share["medusa"] = nbytes(d.heads) / tb
    elif k.startswith("early_exit"):
        share["early_exit"] = (nbytes(target.model.model.layers[:8]) + nbytes(target.model.lm_head)
                               + nbytes(d.adapter)) / tb
    elif k.startswith("distilled"):
        share["distilled (no input embedding)"] = nbytes(d.runner.model, ("embed_tokens",)) / tb
print(json.dumps({"weight_share": {k: round(v, 3) for k, v in share.items()}}))
