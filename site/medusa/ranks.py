"""Per-head rank accuracy of Medusa heads on the target's greedy continuations of packaged
training prompts not trained on, and Medusa's static-tree construction from it (docs/medusa.md).

    OMP_NUM_THREADS=1 python docs/medusa/ranks.py drafters/medusa/artefacts/smollm2-135m-medusa 40
"""
import heapq
import json
import sys

import torch

from spec_zoo.drafters.medusa.heads import load_medusa
from spec_zoo.models import load_target
from spec_zoo.train.data import PACKAGED_PROMPTS, encode_prompts, load_prompts

torch.set_num_threads(1)
heads_dir, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 48
t = load_target()
texts = load_prompts(PACKAGED_PROMPTS, 0, None, 0)[4000:4000 + 3 * n]  # never among the 1,024 trained on
prompts = encode_prompts(t.tokenizer, texts, True, 128)[:n]
heads = load_medusa(heads_dir, t.model)
K, R = heads.num_heads, 10
hits, count = torch.zeros(K, R), torch.zeros(K)
eos = t.tokenizer.eos_token_id
with torch.no_grad():
    for p in prompts:
        out = t.model.generate(torch.tensor([p]), max_new_tokens=96, do_sample=False, eos_token_id=eos,
                               pad_token_id=eos)[0].tolist()
        h = t.model.model(input_ids=torch.tensor([out])).last_hidden_state[0]
        logits = heads(h[len(p) - 1 : len(out) - 1])  # states that chose generated tokens: [g, K, Vd]
        ranks = logits.argsort(-1, descending=True)  # [g, K, Vd]
        vocab = heads.vocab_ids
        for j in range(logits.shape[0]):
            pos = len(p) - 1 + j  # state at pos chose out[pos + 1]; head i guesses out[pos + 2 + i]
            for i in range(K):
                if pos + 2 + i >= len(out):
                    break
                tok = out[pos + 2 + i]
                top = vocab[ranks[j, i, :R]].tolist()
                count[i] += 1
                if tok in top:
                    hits[i, top.index(tok)] += 1
acc = hits / count[:, None]
print(json.dumps({"prompts": len(prompts), "positions": count.tolist(),
                  "rank_acc": [[round(x, 4) for x in r] for r in acc.tolist()]}))
# Medusa's construction: expected acceptance of a path = product of its ranks' accuracies
# (heads assumed independent); take the best N nodes (prefix-closed, as products shrink).
for N in (4, 6, 8, 12, 16, 24, 32):
    frontier = [(-float(acc[0, r]), (r,)) for r in range(R)]
    heapq.heapify(frontier)
    chosen = []
    while len(chosen) < N and frontier:
        v, path = heapq.heappop(frontier)
        chosen.append((path, -v))
        if len(path) < K:
            for r in range(R):
                heapq.heappush(frontier, (v * float(acc[len(path), r]), path + (r,)))
    tau = 1 + sum(v for _, v in chosen)
    print(N, round(tau, 3), json.dumps([list(p) for p, _ in sorted(chosen, key=lambda c: (len(c[0]), c[0]))]))
chain = 1 + sum(float(torch.prod(acc[: i + 1, 0])) for i in range(K))
print("chain expected tau (independent heads):", round(chain, 3))
