"""Teacher-data throughput, batched vs one prompt at a time (docs/training.md):
16 packaged prompts, 32 greedy tokens, the default target, one thread.

    OMP_NUM_THREADS=1 python docs/training/throughput.py
"""

import time

import torch
from omegaconf import OmegaConf

from spec_zoo.models import load_target
from spec_zoo.registry import CONF_DIR
from spec_zoo.train.data import generate_batch
from spec_zoo.train.mixture import categories, mixture_prompts

N, TOKENS = 16, 32
torch.set_num_threads(1)
target = load_target(name="smollm2-135m")
d = OmegaConf.load(f"{CONF_DIR}/train_distill.yaml").data
d.prompts, d.max_prompt_tokens = None, 128  # the packaged prompts, short ones
prompts = mixture_prompts(target.tokenizer, d, categories(d), N)[0]
eos = [target.tokenizer.eos_token_id]
t0 = time.perf_counter()
one = [generate_batch(target.model, [p], TOKENS, 64, 0.0, eos, eos[0], 0) for p in prompts]
t1 = time.perf_counter()
batched = generate_batch(target.model, prompts, TOKENS, 64, 0.0, eos, eos[0], 0)
t2 = time.perf_counter()
same, dlogp = 0, 0.0
for i, (p, o) in enumerate(zip(prompts, one)):
    g = int(o["gen_len"][0])
    same += batched["ids"][i, : len(p) + g].tolist() == o["ids"][0, : len(p) + g].tolist()
    dlogp = max(dlogp, float((batched["topk_logp"][i, :g, 0].float() - o["topk_logp"][0, :g, 0].float()).abs().max()))
print(f"one at a time {N / (t1 - t0):.2f} prompts/s ({t1 - t0:.1f} s); batched ({N}) {N / (t2 - t1):.2f} prompts/s "
      f"({t2 - t1:.1f} s): {(t1 - t0) / (t2 - t1):.1f}x; identical sequences {same}/{N}; "
      f"max |d logp| (top-1) {dlogp:.4f}")
