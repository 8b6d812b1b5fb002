"""Teacher-data and training tokens/s in bfloat16 against float32 on one core (docs/training.md,
issue 45): the default target loaded as spec-zoo-train loads it (`load_target`, `target.dtype`),
packaged prompts, batched greedy teacher data (`generate_batch`, what the store runs), and training
steps under `torch.autocast` as `train.dtype` runs them (float32 master weights, AdamW) with the
whole target as the student: the costliest module any recipe trains, so an upper bound per token.
Writes ``bf16_throughput.json`` and ``bf16_throughput.md`` to ``--out``. Run it on an idle machine:

    OMP_NUM_THREADS=1 python docs/training/bf16_throughput.py --out docs/training
"""

import argparse
import json
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from spec_zoo.models import load_target
from spec_zoo.registry import CONF_DIR
from spec_zoo.runtime.cpp_kernels import host_isa
from spec_zoo.train.data import generate_batch
from spec_zoo.train.mixture import FollowUp, categories, mixture_prompts


def teacher_rate(dtype: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Generated tokens/s of one batched teacher call, the target in ``dtype`` (after a warm-up call)."""
    target = load_target(name="smollm2-135m", dtype=dtype)
    eos = [target.tokenizer.eos_token_id]
    generate_batch(target.model, prompts[:1], 2, 64, 0.0, eos, eos[0], 0)
    t0 = time.perf_counter()
    out = generate_batch(target.model, prompts, new_tokens, 64, 0.0, eos, eos[0], 0)
    return float(out["gen_len"].sum()) / (time.perf_counter() - t0)


def train_rate(dtype: torch.dtype, ids: torch.Tensor, steps: int) -> float:
    """Tokens/s of forward + backward + AdamW over ``ids`` (float32 weights; bf16 under autocast)."""
    model = load_target(name="smollm2-135m").model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return ids.numel() * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16, help="prompts per teacher batch")
    ap.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--train-batch", type=int, default=8, help="sequences per training step")
    ap.add_argument("--train-len", type=int, default=256, help="tokens per training sequence")
    ap.add_argument("--train-steps", type=int, default=5, help="timed training steps")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for the JSON and markdown tables")
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = OmegaConf.load(f"{CONF_DIR}/train_distill.yaml").data
    d.prompts, d.max_prompt_tokens = None, 128  # the packaged prompts, short ones
    tokenizer = load_target(name="smollm2-135m").tokenizer
    prompts = [p for p in mixture_prompts(tokenizer, d, categories(d), a.prompts)[0] if not isinstance(p, FollowUp)]
    ids = torch.randint(0, len(tokenizer), (a.train_batch, a.train_len), generator=torch.Generator().manual_seed(0))
    rows = [{"dtype": name,
             "teacher_tokens_per_s": round(teacher_rate(name, prompts, a.new_tokens), 1),
             "train_tokens_per_s": round(train_rate(dtype, ids, a.train_steps), 1)}
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))]
    table = {"host_isa": host_isa(), "threads": 1, "torch": torch.__version__,
             "settings": vars(a) | {"out": str(a.out)}, "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bf16_throughput.json").write_text(json.dumps(table, indent=1) + "\n")
    md = [f"Host ISA `{table['host_isa']}`, one thread, torch {torch.__version__}; teacher: {a.prompts} prompts x "
          f"{a.new_tokens} greedy tokens, batched; training: whole target, {a.train_batch} x {a.train_len} tokens "
          "a step, AdamW.", "", "| dtype | teacher tokens/s | training tokens/s |", "|---|---:|---:|"]
    md += [f"| {r['dtype']} | {r['teacher_tokens_per_s']} | {r['train_tokens_per_s']} |" for r in rows]
    (a.out / "bf16_throughput.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
