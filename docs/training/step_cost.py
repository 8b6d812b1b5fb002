"""Seconds per training step of a recipe on a store, batches drawn at random against batches of
like lengths (``train.length_groups``): the padded length and time of each step, then the mean.

    OMP_NUM_THREADS=1 taskset -c 0 python docs/training/step_cost.py eagle3 16 \\
        target.dtype=bfloat16 train.dtype=bfloat16 data.num_prompts=3072 head.ttt_steps=3 \\
        data.prompts=../shared/data/train_prompts/prompts.jsonl data.max_new_tokens=128 data.batch_size=64

Arguments: the recipe, the steps to time per draw, then the recipe's config overrides (those of the
store the run reads: a store missing prompts or states is filled first, which takes long).
"""

from __future__ import annotations

import sys
import time

import torch
from hydra import compose, initialize_config_dir

from spec_zoo.train.cli import CONF_DIR
from spec_zoo.train.loop import add_student_data, batch_rows, load_teacher_target, student_for, teacher_split
from spec_zoo.train.methods import recipes


def main(recipe_name: str, steps: int, overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(f"train_{recipe_name}", overrides=["progress=false", "threads=1", *overrides])
    torch.set_num_threads(int(cfg.threads))
    recipe = recipes()[recipe_name].from_config(cfg)
    target = load_teacher_target(cfg)
    split = teacher_split(cfg, target)
    student = student_for(cfg, recipe, target, split)
    add_student_data(cfg, student, target, split)
    opt = torch.optim.AdamW(recipe.trainable(student, cfg), lr=1e-5)
    train, size = split.train, int(cfg.train.batch_size)
    lengths = train.prompt_len + train.gen_len
    bf16 = str(cfg.train.dtype) == "bfloat16"
    for groups in (1, int(cfg.train.length_groups)):
        gen, times = torch.Generator().manual_seed(0), []
        for step in range(steps + 1):  # the first step (allocations) untimed
            rows = batch_rows(step, lengths, size, groups, gen, int(cfg.train.seed))
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = recipe.batch_metrics(student, train, rows, target.vocab_size, str(cfg.loss))["loss"]
            opt.zero_grad()
            loss.float().mean().backward()
            opt.step()
            if step:
                times.append(time.perf_counter() - t)
                print(f"length_groups={groups} step {step}: {times[-1]:.2f} s, padded to {int(lengths[rows].max())}",
                      flush=True)
        print(f"length_groups={groups}: {sum(times) / len(times):.2f} s a step over {len(times)} steps", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
