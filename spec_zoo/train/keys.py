"""The keys every training config shares (target, data, train, output, loss), as `Keys`
the config validation adds to the core's: what their shipped defaults cannot say (ranges,
types of null defaults, the words a key takes). A recipe adds its own (`Recipe.keys`)."""

from __future__ import annotations

import functools

from spec_zoo.schema import NON_NEGATIVE, POSITIVE, SEED, UNIT, Keys, Limit
from spec_zoo.train.losses import LOSSES

# the training loop's compute dtype (`spec_zoo.train.loop.compute_dtype`); weights stay float32
TRAIN_DTYPES = ("float32", "bfloat16", "auto")

LIMITS: dict[str, Limit] = {
    "train.seed": SEED,
    "data.seed": SEED,
    "data.num_prompts": POSITIVE,
    "data.max_prompt_tokens": POSITIVE,
    "data.max_new_tokens": POSITIVE,
    "data.temperature": NON_NEGATIVE,
    "data.top_k": NON_NEGATIVE,
    "data.batch_size": POSITIVE,
    "data.forced_prompts": NON_NEGATIVE,
    "data.student_fraction": Limit(low=0, high=1),
    "data.heldout": UNIT,
    "data.budget_s": NON_NEGATIVE,
    "train.steps": NON_NEGATIVE,
    "train.max_seconds": NON_NEGATIVE,
    "train.budget_s": NON_NEGATIVE,
    "train.batch_size": POSITIVE,
    "train.length_groups": POSITIVE,
    "train.lr": Limit(low=0, low_open=True, example="1e-3"),
    "train.min_lr_ratio": Limit(low=0, high=1),
    "train.warmup": NON_NEGATIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.grad_clip": NON_NEGATIVE,
    "train.eval_every": POSITIVE,
    "train.patience": NON_NEGATIVE,
    "train.ckpt_every": POSITIVE,
}

TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "target.path": ((str,), True),
    "data.prompts": ((str,), True),
    "data.sources": ((list, str), True),
    "data.token_ids": ((list,), True),
    "data.keep_states": ((list,), True),
    "output.quantize": ((str,), True),
    "output.quantize_head": ((str,), True),
}


@functools.cache
def pipeline_keys() -> Keys:
    """The core's keys plus the training pipeline's (the words of dtype and device keys from
    the module that defines them)."""
    from spec_zoo.models import DEVICES, DTYPES
    from spec_zoo.schema import core_keys

    words = {"target.dtype": tuple(DTYPES), "device": tuple(DEVICES), "output.dtype": tuple(DTYPES), "loss": LOSSES,
             "train.dtype": TRAIN_DTYPES}
    return core_keys() | Keys(LIMITS, TYPES, words)
