"""Drafter line-ups shared by the identity and sampling tests: every drafter family,
with drafts that are always, sometimes and never accepted."""

from __future__ import annotations

import copy

import torch

from drafters.eagle import EagleDrafter
from drafters.early_exit import EarlyExitDrafter
from drafters.ngram import NgramDrafter
from drafters.none import NoDrafter
from drafters.small_model import SmallModelDrafter
from spec_zoo.eagle import EagleHead
from spec_zoo.exit_adapter import ExitAdapter


def noisy_copy(model, noise: float, seed: int = 123):
    """The target with a perturbed LM head: a draft that agrees with it partly."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen, dtype=w.dtype))
    return draft


def exit_adapter(model, exit_layer: int = 1) -> ExitAdapter:
    """An (untrained) exit adapter over a reduced draft vocabulary: every token but the last
    quarter, so q is zero on some tokens the target may pick."""
    vocab = model.lm_head.weight.shape[0]
    return ExitAdapter(model, exit_layer, init_layer=len(model.model.layers) - 1, mlp=True,
                       vocab_ids=torch.arange(vocab - max(1, vocab // 4))).eval()


def eagle_head(model) -> EagleHead:
    """An (untrained) EAGLE head over a reduced draft vocabulary, as `exit_adapter`."""
    vocab = model.lm_head.weight.shape[0]
    return EagleHead(model, init_layer=len(model.model.layers) - 1, mlp=True,
                     vocab_ids=torch.arange(vocab - max(1, vocab // 4))).eval()


def drafter_lineup(target_model, sampled: bool = False) -> dict:
    """Name -> factory; factories so each decoder gets a fresh drafter."""
    partial = noisy_copy(target_model, 1.0)
    sample = "auto" if sampled else False
    return {
        "none": lambda: NoDrafter(),
        "ngram_k1": lambda: NgramDrafter(num_draft=1, adaptive=False),
        "ngram_k4_adaptive": lambda: NgramDrafter(num_draft=4, min_ngram=1, max_ngram=3, adaptive=True, max_draft=8),
        "ngram_k6_n2": lambda: NgramDrafter(num_draft=6, min_ngram=2, max_ngram=4, adaptive=False),
        "small_chain_k3": lambda: SmallModelDrafter(partial, num_draft=3, sample=sample),
        "small_chain_adaptive": lambda: SmallModelDrafter(partial, num_draft=2, adaptive=True, max_draft=6, sample=sample),
        "small_chain_self": lambda: SmallModelDrafter(target_model, num_draft=5, sample=sample),
        "small_tree_2x3": lambda: SmallModelDrafter(partial, tree_width=2, tree_depth=3, sample=sample),
        "small_tree_3x2_self": lambda: SmallModelDrafter(target_model, tree_width=3, tree_depth=2, sample=sample),
        "early_exit_k3": lambda: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=sample),
        "early_exit_k3_no_reuse": lambda: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=sample, reuse_kv=False),
        "early_exit_adaptive": lambda: EarlyExitDrafter(1, num_draft=2, max_draft=6, sample=sample, stop_below=0.05),
        "early_exit_adapter": lambda: EarlyExitDrafter(
            1, num_draft=3, adaptive=False, sample=sample, adapter=exit_adapter(target_model)),
        "early_exit_adapter_no_reuse": lambda: EarlyExitDrafter(
            1, num_draft=3, adaptive=False, sample=sample, adapter=exit_adapter(target_model), reuse_kv=False),
        "eagle_k3": lambda: EagleDrafter(eagle_head(target_model), num_draft=3, adaptive=False, sample=sample),
        "eagle_adaptive": lambda: EagleDrafter(eagle_head(target_model), num_draft=2, max_draft=6, sample=sample),
    }
