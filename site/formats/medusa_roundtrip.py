"""Shipped spec-zoo Medusa heads vs the same heads exported to FasterDecoding's layout, on SmolLM2-135M:
``python docs/formats/medusa_roundtrip.py DIR`` after ``spec-zoo-train export --format medusa export.out=DIR
export.dtype=float32``; greedy, 48 tokens per prompt, drafts compared at every step."""

import sys

import torch

from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.drafters.medusa import MedusaDrafter
from spec_zoo.models import load_target
from spec_zoo.sampling import SamplingParams
from spec_zoo.verifiers.greedy import GreedyVerifier

torch.set_num_threads(1)
target = load_target("smollm2-135m")
tok = target.tokenizer
prompts = ["def fibonacci(n):", "The capital of France is", "Question: what is 12 times 7? Answer:",
           "Write a short poem about the sea."]


class Spy(MedusaDrafter):
    def propose(self, state):
        draft = super().propose(state)
        self.log.append(draft.tokens.tolist())
        return draft


out = {}
for name, heads in (("spec_zoo", None), ("medusa layout", sys.argv[1])):
    drafter = Spy(heads=heads)
    drafter.log = []
    decoder = SpeculativeDecoder(target, drafter, GreedyVerifier(), SamplingParams())
    ids, taus = [], []
    for p in prompts:
        o = decoder.generate(tok.encode(p), max_new_tokens=48, eos_token_ids=[])
        ids.append(o.ids)
        taus.append(round(o.stats.tau, 3) if hasattr(o.stats, "tau") else None)
    out[name] = (ids, drafter.log, taus)
    print(name, "drafts", len(drafter.log), "tau per prompt", taus)
a, b = out["spec_zoo"], out["medusa layout"]
print("same output ids:", a[0] == b[0], " same drafts at every step:", a[1] == b[1])
