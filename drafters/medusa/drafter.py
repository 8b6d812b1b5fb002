"""``drafter=medusa``: draft from the target's own last hidden state with trained Medusa heads.

Verification already computes the target's last-layer states; the drafter takes them
(``needs_target_hidden``) and reads only the last one, h, the state that chose the last
committed token. Head i guesses the token i + 1 places after that one, so one draft costs
K small head products and no decoder layer (`spec_zoo.drafters.medusa.heads`).

* chain (``tree: null``): token i is head i's argmax, or a sample from its distribution
  when the run samples (q recorded: a head does not read the tokens before its own, so its
  distribution is exactly the q the token was drawn from, and rejection stays exact);
* tree (``tree``: a policy of `spec_zoo.trees`): head d proposes the children of every
  node of depth d - 1 (a head does not see its parent, so they are the same ranked tokens
  under every parent). ``{policy: static, choices: ...}`` is Medusa's static tree, ``auto``
  the tree predicted fastest from measured acceptance and the target's cost table. Top-k
  picks when greedy (q one-hot), draws without replacement from q_d when sampling: both
  exact under rejection.

With ``runtime=compiled`` the heads and the scatter into the target's vocabulary are one
compiled graph (`spec_zoo.runtime.compiled_module`), compiled once per process beside the target's.

The first step of a sequence drafts nothing: the target has not read the prompt yet.
Apart from a tree policy that learns (``auto``), the drafter keeps no state between steps, so
it may sit in a cascade or a merge.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.drafters.medusa.formats import FORMATS, load_published_medusa
from spec_zoo.drafters.medusa.heads import MedusaHeads, load_medusa
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.models import RUNTIMES, check_runtime
from spec_zoo.runtime.compiled_module import CompiledModule
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import drafts_sampled, to_full_vocab
from spec_zoo.staged import LevelDrafter

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-medusa"


class MedusaDrafter(LevelDrafter):
    """heads:      a Medusa-heads dir (`spec-zoo-train medusa`, or FasterDecoding's layout:
                `spec_zoo.drafters.medusa.formats`), None (the heads shipped for SmolLM2-135M), or a
                heads module; they must be trained for this target.
    format:     the layout of ``heads``: auto (sniffed from its files), spec_zoo, medusa.
    num_draft:  chain: tokens per draft (None = one per head); the starting length when adaptive.
    adaptive, token_cost, learn_cost: chain: choose each draft's length by expected speedup
                (`spec_zoo.draft_length`), up to one token per head.
    sample:     "auto" samples from the heads when temperature > 0 (q recorded), argmax at 0.
    tree:       None = a chain; else a tree policy (`spec_zoo.trees`: an option of conf/tree/
                such as ``auto``, or ``{policy: static, choices: [[0], [1], [0, 0]]}``), at most
                one level per head.
    runtime:    the heads' runtime: ``eager``, or ``compiled`` (one compiled graph,
                `spec_zoo.runtime.compiled_module`; compiles on first use).
    """

    name = "medusa"

    def __init__(self, heads=None, num_draft: int | None = None, adaptive: bool = False,
                 sample: str | bool = "auto", tree: str | dict | None = None, token_cost: float = 0.05,
                 learn_cost: bool = True, format: str = "auto", runtime: str = "eager"):
        if runtime not in RUNTIMES:
            raise ConfigError(f"drafter.runtime={runtime!r} is not a runtime; use one of: {', '.join(RUNTIMES)}.")
        if format not in FORMATS:
            raise ConfigError(f"drafter.format={format!r}; use one of {', '.join(FORMATS)}.")
        if heads is None and format == "medusa":
            raise ConfigError("drafter.format=medusa needs drafter.heads=PATH (the Medusa heads' directory).")
        if heads is None and not (SHIPPED / MedusaHeads.RECORD).is_file():
            raise ConfigError(f"the shipped Medusa heads are missing ({SHIPPED}); reinstall spec-zoo, or set "
                              "drafter.heads=DIR to heads made with `spec-zoo-train medusa`.")
        self._settings(heads, num_draft, adaptive, sample, tree, token_cost, learn_cost)
        self.format, self.runtime = format, runtime
        self.compiled: CompiledModule | None = None

    def _levels(self) -> tuple[int, str]:
        return self.heads.num_heads, "the Medusa heads have"

    def _attached(self, target: Target) -> None:
        self.vocab_size, self.dtype = target.vocab_size, next(self.heads.parameters()).dtype
        if self.runtime == "compiled":
            check_runtime("compiled", str(self.dtype).removeprefix("torch."), str(target.device), "drafter")
            width = int(target.model.lm_head.weight.shape[1])
            self.compiled = CompiledModule(self.heads, self._logits, torch.zeros(width, dtype=self.dtype),
                                           "the Medusa heads")

    def _logits(self, state: torch.Tensor) -> torch.Tensor:
        """Every head's logits over the target's vocabulary [K, V] for one state [H]."""
        return to_full_vocab(self.heads(state), self.heads.vocab_ids, self.vocab_size)

    def compiled_parts(self) -> list[CompiledModule]:
        """The heads' compiled graph when they run compiled: what `spec-zoo warmup` compiles."""
        return [self.compiled] if self.compiled is not None else []

    def _load(self, source, target: Target):
        if isinstance(source, torch.nn.Module):
            return source
        published = self.format == "medusa" or (
            self.format == "auto" and source is not None
            and not (Path(source).expanduser() / MedusaHeads.RECORD).is_file()
            and (Path(source).expanduser() / "config.json").is_file())
        if published:
            return load_published_medusa(source, target.model)
        return load_medusa(source or SHIPPED, target.model)

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        if self.target is None:
            raise RuntimeError("MedusaDrafter.attach(target) must be called before drafting")
        if state.target_hidden is None:  # the target has not read the prompt yet
            return Draft.empty()
        logits = (self.compiled or self._logits)(state.target_hidden[-1].to(self.dtype))  # [K, V]
        if self.tree is not None:  # head d proposes the children of every node of depth d - 1
            def expand(tree: Draft, nodes: list[int]) -> torch.Tensor:
                return logits[[0 if n == ROOT else tree.depths[n] + 1 for n in nodes]]

            capped = replace(state, max_depth=min(state.max_depth, self.heads.num_heads))
            return self.tree.build(expand, capped, drafts_sampled(self.sample_mode, state.sampling))
        k = min(self.length.choose(state=state), state.max_depth)
        if k == 0:
            return Draft.empty()
        rows = iter(logits[1:])
        return self.draft_chain(state, logits[0], k, lambda token, more: next(rows))
