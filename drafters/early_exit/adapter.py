"""The exit adapter: a small trained module between layer E and the LM head (Kangaroo).

The untrained early exit (the target's final norm + LM head on layer E's hidden state)
rarely agrees with the target on a thin model, because layer E's states are not yet
in the form the head reads. The adapter closes part of that gap *next to* the target:
a `spec_zoo.draft_head.BlockHead` (one decoder layer of the target's class with its own
KV cache, a norm, a draft-vocabulary head) reading layer E's states.

Artefact: a directory with ``adapter.safetensors`` and ``adapter.json`` (exit layer,
shapes, the target it was trained for, training record). Loading refuses another
target, another exit layer, or files that do not fit together.
"""

from __future__ import annotations

import torch

from spec_zoo.draft_head import BlockHead, load_head
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack


class ExitAdapter(BlockHead):
    """Layer-E hidden states -> logits over the draft vocabulary (see `BlockHead`)."""

    FORMAT, RECORD, WEIGHTS, WHAT = "spec-zoo-exit-adapter", "adapter.json", "adapter.safetensors", "exit-adapter"

    def __init__(self, target_model, exit_layer: int, init_layer: int, mlp: bool = True,
                 vocab_ids: torch.Tensor | None = None, train_head: bool = False):
        check_exit_layer(exit_layer, DecoderStack(target_model).num_layers)
        super().__init__(target_model, init_layer, mlp, vocab_ids, train_head)
        self.exit_layer = exit_layer

    def describe(self) -> dict:
        return {"exit_layer": self.exit_layer, **super().describe()}

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids):
        return cls(target_model, int(record["exit_layer"]), int(record["init_layer"]), bool(record["mlp"]),
                   vocab_ids, bool(record["train_head"]))


def check_exit_layer(exit_layer: int, num_layers: int, key: str = "drafter.exit_layer") -> None:
    if not 1 <= int(exit_layer) <= num_layers - 1:
        raise ConfigError(f"{key}={exit_layer}; the target has {num_layers} layers, so the exit must be in "
                          f"1..{num_layers - 1} (the draft runs layers 0..E-1, the target resumes at E).")


def load_adapter(path, target_model, exit_layer: int | None = None) -> ExitAdapter:
    """The adapter at ``path``, checked against ``target_model`` (and ``exit_layer`` when given)."""
    adapter = load_head(ExitAdapter, path, target_model, "drafter.adapter", "spec-zoo-train early_exit")
    if exit_layer is not None and adapter.exit_layer != int(exit_layer):
        raise ConfigError(f"drafter.adapter={str(path)!r} was trained for exit layer {adapter.exit_layer}, "
                          f"not drafter.exit_layer={exit_layer}; set drafter.exit_layer={adapter.exit_layer} "
                          "or train an adapter for this exit layer.")
    return adapter
