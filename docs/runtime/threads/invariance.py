"""Batch invariance of the compiled runtime at the thread count torch runs with.

OMP_NUM_THREADS=2 python invariance.py: row 0's logits after 100 cached tokens with M = 1..16,
24 and 32 scored rows against M = 0, and prompt lookup's greedy output against plain decoding's."""

import torch

from spec_zoo import SpeculativeDecoder
from spec_zoo.draft import Draft
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.models import load_target
from spec_zoo.verifiers.greedy import GreedyVerifier

print("threads", torch.get_num_threads())
target = load_target(runtime="compiled")
target.warm_up()
prompt = [(7 * i) % 49152 for i in range(100)]
target.reset()
alone = target.score(prompt, Draft.empty()).logits[0]
bad = []
for m in list(range(1, 17)) + [24, 32]:
    target.reset()
    rows = target.score(prompt, Draft.chain([(13 * j + 5) % 49152 for j in range(m)])).logits
    if not torch.equal(rows[0], alone):
        bad.append((m, float((rows[0] - alone).abs().max())))
print("row 0 differs at M:", bad)
ids = target.tokenizer("Write a Python function that checks whether a string is a palindrome.")["input_ids"]
plain = SpeculativeDecoder(target).generate(ids, max_new_tokens=64, eos_token_ids=[]).ids
spec = SpeculativeDecoder(target, NgramDrafter(), GreedyVerifier()).generate(ids, max_new_tokens=64, eos_token_ids=[])
print("ngram == plain:", spec.ids == plain)
