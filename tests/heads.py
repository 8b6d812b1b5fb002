"""Shared by the tests of the trained heads next to the target (exit adapter, EAGLE head):
a tiny teacher, a short training config, and the corrupt-artefact checks."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spec_zoo.artefacts import describe_target
from spec_zoo.draft_head import save_head
from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from tests.test_distill import _prompts
from tests.tiny import tiny_llama


def teacher(seed: int = 3):
    model = tiny_llama(seed, vocab=64, layers=3, sharpness=3.0, dtype=torch.float32)
    model.generation_config.eos_token_id = 1
    return model


def train_cfg(config: str, tmp_path, *overrides):
    """``config`` (train_early_exit / train_eagle) for 40 quick steps on the tiny teacher."""
    base = [
        "data.max_new_tokens=16", "data.heldout=0.25", "data.batch_size=8", "data.top_k=16", "data.forced_prompts=16",
        "train.steps=40", "train.batch_size=8", "train.lr=1e-2", "train.warmup=4", "train.eval_every=10",
        "train.ckpt_every=10", f"output.dir={tmp_path / 'head'}", f"data.cache_dir={tmp_path / 'cache'}",
        "output.dtype=float32", "progress=false", "threads=1",
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config, overrides=base + list(overrides))
    OmegaConf.update(cfg, "data.token_ids", _prompts(64))
    return cfg


def check_corrupt_files_fail(load, path, bad, cls, other_head, model) -> None:
    """``load(dir, model)`` of an empty dir, a corrupt record, a foreign record, truncated
    weights, and weights that do not fit the record: each a clear `ConfigError`."""
    bad.mkdir()
    with pytest.raises(ConfigError, match=f"not an {cls.WHAT} directory"):
        load(bad, model)
    (bad / cls.RECORD).write_text("{not json")
    with pytest.raises(ConfigError, match="corrupt"):
        load(bad, model)
    (bad / cls.RECORD).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match=f"not a spec-zoo {cls.WHAT} record"):
        load(bad, model)
    (bad / cls.RECORD).write_text((path / cls.RECORD).read_text())
    (bad / cls.WEIGHTS).write_bytes((path / cls.WEIGHTS).read_bytes()[:200])
    with pytest.raises(ConfigError, match="corrupt or incomplete"):
        load(bad, model)
    record = json.loads((path / cls.RECORD).read_text())
    save_head(other_head, bad, describe_target(model, None), {})  # an attention-only head ...
    (bad / cls.RECORD).write_text(json.dumps({**record, "mlp": True}))  # ... recorded as having an MLP
    with pytest.raises(ConfigError, match="do not fit"):
        load(bad, model)
