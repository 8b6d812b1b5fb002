# ruff: noqa: E402 (a measurement script: the thread count is set before the models load)
"""Issue 47's head-cost goal on Gemma 3 270M: the EAGLE-3 head's seconds per drafted token over
one compiled target step t(1), its head eager and compiled, interleaved per round.

python docs/gemma3/head_cost.py HEAD_DIR [DTYPE] [ROUNDS]: the head made by `spec-zoo-train eagle3`
(docs/gemma3.md), float32 or bfloat16 (default float32), 3 rounds; one thread."""
import json
import os
import statistics
import sys

import torch

torch.set_num_threads(1)
from spec_zoo import SpeculativeDecoder
from spec_zoo.auto import workload_file
from spec_zoo.costs import draft_rounds
from spec_zoo.drafters.eagle import EagleDrafter
from spec_zoo.models import load_target
from spec_zoo.runtime.cpp_kernels import host_isa
from spec_zoo.verifiers.greedy import GreedyVerifier

head, dtype = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "float32"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
target = load_target("gemma3-270m", dtype=dtype, runtime="compiled", max_cache_len=512)
drafters = {runtime: EagleDrafter(head, num_draft=4, adaptive=False, runtime=runtime)
            for runtime in ("eager", "compiled")}
decoders = {k: SpeculativeDecoder(target, d, GreedyVerifier()) for k, d in drafters.items()}
target.warm_up()  # the graph handing out the head's layers (`Target.hand_out`), named when the drafters attached
for d in drafters.values():
    for part in d.compiled_parts():
        print("draft compile", round(part.warm_up(), 1), part.compile_cached, file=sys.stderr, flush=True)
lines = workload_file("continuation").read_text(encoding="utf-8").splitlines()
prompts = [target.tokenizer(json.loads(line)["turns"][0])["input_ids"] for line in lines if line.strip()][:4]
t1, per = draft_rounds(target, decoders, prompts, rounds, 48, said=lambda r, t1, per: print(
    r, os.getloadavg(), {k: round(v[-1] / t1[-1], 4) for k, v in per.items()}, file=sys.stderr, flush=True))
t = statistics.median(t1)
print(json.dumps({"dtype": dtype, "isa": host_isa(), "threads": torch.get_num_threads(), "t1_ms": round(t * 1e3, 2),
                  "load": os.getloadavg(), "draft_vocab": int(drafters["eager"].head.lm_head.out_features),
                  "per_token_steps": {k: [round(x / t, 4) for x in v] for k, v in per.items()},
                  "median_steps": {k: round(statistics.median(v) / t, 4) for k, v in per.items()}}, indent=1))
