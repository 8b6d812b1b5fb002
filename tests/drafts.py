"""Drafter line-ups shared by the identity and sampling tests: every drafter family,
with drafts that are always, sometimes and never accepted."""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from spec_zoo.draft_head import StagedHead
from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.eagle.head import EagleHead
from spec_zoo.drafters.early_exit.adapter import ExitAdapter
from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
from spec_zoo.drafters.hydra.drafter import HydraDrafter
from spec_zoo.drafters.hydra.heads import HydraHeads
from spec_zoo.drafters.medusa.drafter import MedusaDrafter
from spec_zoo.drafters.medusa.heads import MedusaHeads
from spec_zoo.drafters.mlp_speculator.drafter import MLPSpeculatorDrafter
from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.none import NoDrafter
from spec_zoo.drafters.parallel.drafter import ParallelDrafter
from spec_zoo.drafters.quantized import QuantizedDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.testing import tiny_llama
from spec_zoo.trees import Static


def char_tokenizer(symbols: list[str], merges: list[tuple[str, str]] | None = None):
    """A fast BPE tokenizer over "<s>", "</s>" and ``symbols`` (ids in that order), merging
    ``merges`` (each pair's join must be a symbol): tiny vocabularies for cross-tokenizer tests."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(["<s>", "</s>", *symbols])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges or []))
    tokenizer.decoder = decoders.Fuse()  # text is the tokens' strings joined, no spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def mirrored_draft(model, symbols: list[str]):
    """(draft model, its tokenizer): the target itself under a vocabulary with ``symbols`` in
    reverse order: another tokenizer whose drafts the target always accepts at T=0."""
    mirror = symbols[::-1]
    perm = torch.tensor([0, 1] + [2 + symbols.index(s) for s in mirror])
    draft = copy.deepcopy(model)
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight[perm])
        draft.lm_head.weight.copy_(model.lm_head.weight[perm])
    return draft, char_tokenizer(mirror)


def merged_draft(symbols: list[str], merges: list[tuple[str, str]], seed: int = 7, sharpness: float = 3.0):
    """(draft model, its tokenizer): a random model over ``symbols`` plus the joins of ``merges``
    (multi-character tokens the target's vocabulary lacks)."""
    tokenizer = char_tokenizer(symbols + [a + b for a, b in merges], merges)
    return tiny_llama(seed, vocab=len(tokenizer), sharpness=sharpness), tokenizer


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


def medusa_heads(model, seed: int = 5) -> MedusaHeads:
    """Medusa heads over a reduced draft vocabulary (as `exit_adapter`), their blocks random
    (untrained heads all repeat the target's next token), so the heads disagree."""
    vocab = model.lm_head.weight.shape[0]
    heads = MedusaHeads(model, 4, vocab_ids=torch.arange(vocab - max(1, vocab // 4)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            w = block.linear.weight
            w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) / w.shape[1] ** 0.5)
    return heads.eval()


def staged_heads(cls: type[StagedHead], model, stages: int = 3, seed: int = 5) -> StagedHead:
    """Hydra heads or an MLP speculator over a reduced draft vocabulary (as `exit_adapter`),
    every matrix random from ``seed`` (untrained Hydra heads would all repeat the target's
    next token), so the stages disagree with the target and with each other."""
    vocab = model.lm_head.weight.shape[0]
    heads = cls(model, stages, vocab_ids=torch.arange(vocab - max(1, vocab // 4)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[1] ** 0.5)
    return heads.eval()


@functools.cache  # one artefact per model, written once
def parallel_draft(model, k: int = 3, seed: int = 5, dtype: str = "float64") -> Path:
    """A parallel-draft dir for ``model``: a one-layer distilled base over a reduced vocabulary
    (token 1 outside it) and k - 1 random mask embeddings with random low-rank updates of its
    layers from ``seed`` (so the mask rows disagree with the target and with each other)."""
    from spec_zoo.artefacts import describe_target
    from spec_zoo.drafters.distilled.student import save_artefact, student_from_target
    from spec_zoo.drafters.parallel.model import save_parallel, weights_digest

    root = Path(tempfile.mkdtemp(prefix="spec-zoo-parallel-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # the worker's copy, gone when it exits
    vocab = model.lm_head.weight.shape[0]
    student = student_from_target(model, 1, None, torch.tensor([0, *range(2, vocab)]))
    target = describe_target(model, "tiny")
    base = save_artefact(student, root / "base", {"target": target, "init": {"kind": "target", "layers": 1}},
                         dtype=dtype, quantize=None)  # float64 kept: the tests compare exact values
    gen = torch.Generator().manual_seed(seed)
    H = model.config.hidden_size
    updates = {name: (torch.randn(w.shape[0], 2, generator=gen, dtype=torch.float64) / 2,
                      torch.randn(2, w.shape[1], generator=gen, dtype=torch.float64) / w.shape[1] ** 0.5)
               for name, w in student.lm.named_parameters() if ".layers." in name and w.dim() == 2}
    masks = torch.randn(k - 1, H, generator=gen, dtype=torch.float64)
    record = {"target": target, "base": {"path": str(base), "sha256": weights_digest(base)}}
    return save_parallel(root / "parallel", masks, updates, record, dtype=getattr(torch, dtype), quantize=None)


_PARALLEL: dict = {}


def parallel_drafter(model, **options) -> ParallelDrafter:
    """A fresh float64 `ParallelDrafter` of `parallel_draft` (loaded from disk once per model and
    options, then copied: a certification builds one per decode)."""
    key = (id(model), repr(sorted(options.items())))
    if key not in _PARALLEL:  # the model is kept with it, so its id is not reused
        _PARALLEL[key] = model, ParallelDrafter(parallel_draft(model), dtype="float64", **options)
    return copy.deepcopy(_PARALLEL[key][1])


MEDUSA_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]


def drafter_lineup(target_model, sampled: bool = False) -> dict:
    """Name -> factory; factories so each decoder gets a fresh drafter."""
    partial = noisy_copy(target_model, 1.0)
    sample = "auto" if sampled else False
    return {
        "none": lambda: NoDrafter(),
        "ngram_k1": lambda: NgramDrafter(num_draft=1, adaptive=False),
        "ngram_k4_adaptive": lambda: NgramDrafter(num_draft=4, min_ngram=1, max_ngram=3, adaptive=True, max_draft=8),
        "ngram_k6_n2": lambda: NgramDrafter(num_draft=6, min_ngram=2, max_ngram=4, adaptive=False),
        "ngram_tree": lambda: NgramDrafter(num_draft=4, adaptive=False, branches=3, max_nodes=10),
        "small_chain_k3": lambda: SmallModelDrafter(partial, num_draft=3, sample=sample),
        "small_chain_adaptive": lambda: SmallModelDrafter(partial, num_draft=2, adaptive=True, max_draft=6,
                                                          sample=sample),
        "small_chain_self": lambda: SmallModelDrafter(target_model, num_draft=5, sample=sample),
        "small_tree_2x3": lambda: SmallModelDrafter(partial, tree_width=2, tree_depth=3, sample=sample),
        "small_tree_3x2_self": lambda: SmallModelDrafter(target_model, tree_width=3, tree_depth=2, sample=sample),
        "early_exit_k3": lambda: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=sample),
        "early_exit_k3_no_reuse": lambda: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=sample,
                                                           reuse_kv=False),
        "early_exit_adaptive": lambda: EarlyExitDrafter(1, num_draft=2, max_draft=6, sample=sample, stop_below=0.05),
        "early_exit_adapter": lambda: EarlyExitDrafter(
            1, num_draft=3, adaptive=False, sample=sample, adapter=exit_adapter(target_model)),
        "early_exit_adapter_no_reuse": lambda: EarlyExitDrafter(
            1, num_draft=3, adaptive=False, sample=sample, adapter=exit_adapter(target_model), reuse_kv=False),
        "eagle_k3": lambda: EagleDrafter(eagle_head(target_model), num_draft=3, adaptive=False, sample=sample),
        "eagle_adaptive": lambda: EagleDrafter(eagle_head(target_model), num_draft=2, max_draft=6, sample=sample),
        "eagle_tree_dynamic": lambda: EagleDrafter(eagle_head(target_model), sample=sample,
                                                   tree={"policy": "dynamic", "width": 3, "depth": 4, "budget": 8}),
        "medusa_k3": lambda: MedusaDrafter(medusa_heads(target_model), num_draft=3, sample=sample),
        "medusa_adaptive": lambda: MedusaDrafter(medusa_heads(target_model), num_draft=2, adaptive=True, sample=sample),
        "medusa_tree": lambda: MedusaDrafter(medusa_heads(target_model), sample=sample, tree=Static(MEDUSA_TREE)),
        "hydra_k3": lambda: HydraDrafter(staged_heads(HydraHeads, target_model), num_draft=3, sample=sample),
        "hydra_tree": lambda: HydraDrafter(staged_heads(HydraHeads, target_model), sample=sample,
                                           tree=Static(MEDUSA_TREE[:6])),
        "mlp_speculator_adaptive": lambda: MLPSpeculatorDrafter(staged_heads(MLPSpeculator, target_model), num_draft=2,
                                                                adaptive=True, sample=sample),
        "mlp_speculator_tree": lambda: MLPSpeculatorDrafter(staged_heads(MLPSpeculator, target_model), sample=sample,
                                                            tree={"policy": "topk", "width": 2, "depth": 3}),
        "quantized_k3": lambda: QuantizedDrafter(num_draft=3, adaptive=False, sample=sample, runtime="eager"),
        "quantized_adaptive_8bit": lambda: QuantizedDrafter(bits=8, head_bits=4, num_draft=2, max_draft=6,
                                                            sample=sample, runtime="eager"),
        "quantized_tree": lambda: QuantizedDrafter(tree_width=2, tree_depth=2, sample=sample, runtime="eager"),
        "parallel_k3": lambda: parallel_drafter(target_model, num_draft=3, sample=sample),
        "parallel_tree": lambda: parallel_drafter(target_model, sample=sample,
                                                   tree={"policy": "static", "choices": MEDUSA_TREE[:6]}),
    }


# -- composed drafters (drafters/cascade.py, drafters/merge.py), built from the entries above;
#    appended as a wrapper so the shared identity and sampling tests cover them too
_single_lineup = drafter_lineup


def drafter_lineup(target_model, sampled: bool = False) -> dict:  # extends the line-up above
    """Name -> factory, the single drafters plus cascades and merges of them."""
    from spec_zoo.drafters.cascade import CascadeDrafter
    from spec_zoo.drafters.merge import MergeDrafter

    single = _single_lineup(target_model, sampled)

    def composed(cls, *names):
        return lambda: cls([single[name]() for name in names])

    return {
        **single,
        # n-gram first; the small draft when the lookup finds nothing or has been rejected lately
        "cascade_ngram_small": composed(CascadeDrafter, "ngram_k4_adaptive", "small_chain_k3"),
        # EAGLE is asked only some steps: it must still receive every target feature
        "cascade_ngram_eagle": composed(CascadeDrafter, "ngram_k4_adaptive", "eagle_k3"),
        # early exit with KV reuse asked only some steps: its shallow KV must rewind with the target
        "cascade_ngram_early_exit": composed(CascadeDrafter, "ngram_k4_adaptive", "early_exit_k3"),
        "merge_ngram_small": composed(MergeDrafter, "ngram_k4_adaptive", "small_chain_k3"),
        # a tree + a feature chain + a lookup chain in one tree
        "merge_tree_eagle_ngram": composed(MergeDrafter, "small_tree_2x3", "eagle_k3", "ngram_k6_n2"),
        # two drafts that often coincide: sampled ones must stay separate subtrees
        "merge_sampled_twins": composed(MergeDrafter, "small_chain_k3", "small_chain_self"),
        # early exit (KV reuse) merged with a lookup: its partial forward is dropped when both propose
        "merge_early_exit_ngram": composed(MergeDrafter, "early_exit_k3", "ngram_k4_adaptive"),
    }
