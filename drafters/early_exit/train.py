"""``spec-zoo-train early_exit``: self-distil an exit adapter (Kangaroo-style).

The pipeline is `spec_zoo.train.loop.train_module` (teacher data, losses, progress,
checkpoints, resume, seeds) with another module: an `ExitAdapter` that reads the target's
own layer-E hidden states and learns the target's next-token distributions. The target
stays frozen; its layers 0..E-1 are run once per training sequence and their output is
kept in memory (the adapter is the only thing that trains), which makes a step cost one
decoder layer instead of E.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.drafters.early_exit.adapter import ExitAdapter, check_exit_layer, load_adapter
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack, causal_mask
from spec_zoo.runtime.target import Target
from spec_zoo.schema import NON_NEGATIVE, POSITIVE, Keys
from spec_zoo.train.heads import HeadRecipe, HeadStudent
from spec_zoo.train.loop import train_module
from spec_zoo.train.methods import register
from spec_zoo.train.recipe import Student


class ExitStudent(HeadStudent):
    """An `ExitAdapter` (``lm``) reading the frozen target's states entering layer E."""

    lm: ExitAdapter

    @property
    def states_name(self) -> str:
        return f"layer{self.lm.exit_layer}"

    def target_states(self, ids: torch.Tensor) -> torch.Tensor:
        ids, T = ids.to(self.stack.model.device), ids.shape[1]
        hidden = self.stack.embed(ids)
        positions = torch.arange(T, device=ids.device)[None]
        return self.stack.run(hidden, 0, self.lm.exit_layer, positions, None,
                              causal_mask(0, T, hidden.dtype, hidden.device))

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Adapted states [B, L, H] of right-padded ``ids``."""
        states = self.cached_states(ids, attention_mask.sum(1).tolist())
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)[None]
        rotary = self.stack.rotary(states, positions)
        return self.lm(states, rotary, None, causal_mask(0, T, states.dtype, states.device))


@register("early_exit")
class ExitRecipe(HeadRecipe):
    """What `spec-zoo-train early_exit` trains: an `ExitAdapter` (section ``adapter``)."""

    desc, drafter, section, student = "exit adapter", "early_exit", "adapter", ExitStudent
    artefact = ExitAdapter.RECORD, ExitAdapter.FORMAT
    keys = Keys(limits={"adapter.vocab_size": NON_NEGATIVE, "adapter.exit_layer": POSITIVE},
                types={"adapter.init_layer": ((int,), True)})

    def check(self, cfg: DictConfig) -> None:
        super().check(cfg)
        if int(cfg.adapter.exit_layer) < 1:
            raise ConfigError(f"adapter.exit_layer={cfg.adapter.exit_layer}; the exit must be a layer index >= 1.")

    def build(self, cfg: DictConfig, target_model: torch.nn.Module, init_layer: int,
              vocab_ids: torch.Tensor | None) -> ExitAdapter:
        a = cfg.adapter
        check_exit_layer(int(a.exit_layer), DecoderStack(target_model).num_layers, key="adapter.exit_layer")
        return ExitAdapter(target_model, int(a.exit_layer), init_layer, bool(a.mlp), vocab_ids, bool(a.train_head))


    def load(self, path: Path, model: torch.nn.Module) -> Student:
        return ExitStudent(model, load_adapter(path, model))


def train_exit_adapter(cfg: DictConfig, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train early_exit`` (conf/train_early_exit.yaml); return the adapter dir."""
    return train_module(cfg, ExitRecipe.from_config(cfg), target)
