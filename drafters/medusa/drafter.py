"""``drafter=medusa``: draft from the target's own last hidden state with trained Medusa heads.

Verification already computes the target's last-layer states; the drafter takes them
(``needs_target_hidden``) and reads only the last one, h, the state that chose the last
committed token. Head i guesses the token i + 1 places after that one, so one draft costs
K small head products and no decoder layer (`spec_zoo.drafters.medusa.heads`).

* chain (``choices: null``): token i is head i's argmax, or a sample from its distribution
  when the run samples (q recorded: a head does not read the tokens before its own, so its
  distribution is exactly the q the token was drawn from, and rejection stays exact);
* tree (``choices``: Medusa's static tree): each choice is a path of ranks, ``[0, 1]`` = the
  top token of head 1 followed by the second token of head 2. Top-k picks are deterministic
  (``probs=None``: q one-hot), which exact verifiers handle as they are.

The first step of a sequence drafts nothing: the target has not read the prompt yet.
The drafter keeps no state between steps, so it may sit in a cascade or a merge.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spec_zoo.chain import ChainDrafter
from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.drafters.medusa.heads import MedusaHeads, load_medusa
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Verdict
from spec_zoo.sampling import check_sample_mode, to_full_vocab
from spec_zoo.stats import StepStats
from spec_zoo.target import Target

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-medusa"


def check_choices(choices) -> list[tuple[int, ...]] | None:
    """Medusa's static tree, checked and in topological order (by depth, then ranks)."""
    if choices is None:
        return None
    fix = "give a list of rank paths such as [[0], [1], [0, 0]], each path's prefixes listed too"
    try:
        paths = [tuple(int(r) for r in c) for c in choices]
    except (TypeError, ValueError):
        raise ConfigError(f"drafter.choices={choices!r} is not a list of lists of ranks; {fix}.") from None
    if not paths or any(not p or min(p) < 0 for p in paths) or len(set(paths)) != len(paths):
        raise ConfigError(f"drafter.choices: every path must be a non-empty list of ranks >= 0, none repeated; {fix}.")
    missing = sorted({p[:-1] for p in paths if len(p) > 1} - set(paths))
    if missing:
        raise ConfigError(f"drafter.choices lists paths without their prefix {list(missing[0])}; {fix}.")
    return sorted(paths, key=lambda p: (len(p), p))


class MedusaDrafter(ChainDrafter):
    """heads:      a Medusa-heads dir (`spec-zoo-train medusa`), None (the heads shipped for
                SmolLM2-135M), or a `MedusaHeads`; they must be trained for this target.
    num_draft:  chain: tokens per draft (None = one per head); the starting length when adaptive.
    adaptive, token_cost, learn_cost: chain: choose each draft's length by expected speedup
                (`spec_zoo.draft_length`), up to one token per head.
    sample:     chain: "auto" samples from the heads when temperature > 0 (q recorded), argmax at 0.
    choices:    None = a chain; else Medusa's static tree as rank paths (see the module docstring).
    """

    name = "medusa"
    needs_target_hidden = True

    def __init__(self, heads=None, num_draft: int | None = None, adaptive: bool = False,
                 sample: str | bool = "auto", choices: list | None = None, token_cost: float = 0.05,
                 learn_cost: bool = True):
        check_sample_mode(sample)
        if heads is None and not (SHIPPED / MedusaHeads.RECORD).is_file():
            raise ConfigError(f"the shipped Medusa heads are missing ({SHIPPED}); reinstall spec-zoo, or set "
                              "drafter.heads=DIR to heads made with `spec-zoo-train medusa`.")
        if num_draft is not None and int(num_draft) < 1:
            raise ConfigError(f"drafter.num_draft={num_draft}; use a positive length or null (one per head).")
        self.heads_source, self.sample_mode, self.choices = heads, sample, check_choices(choices)
        self.num_draft, self.adaptive, self.token_cost, self.learn_cost = num_draft, adaptive, token_cost, learn_cost
        self.target: Target | None = None

    @property
    def drafts_trees(self) -> bool:
        return self.choices is not None

    def attach(self, target: Target) -> None:
        source = self.heads_source
        self.heads = source if isinstance(source, MedusaHeads) else load_medusa(source or SHIPPED, target.model)
        K = self.heads.num_heads
        if self.choices and max(map(len, self.choices)) > K:
            raise ConfigError(f"drafter.choices has a path {max(map(len, self.choices))} deep but the Medusa heads "
                              f"have {K} heads (one per level); use paths of at most {K} ranks.")
        if int(self.num_draft or K) > K:
            raise ConfigError(f"drafter.num_draft={self.num_draft} but the Medusa heads have {K} heads (one token "
                              f"each); use at most {K}, or null for one per head.")
        self.length = DraftLength(int(self.num_draft or K), self.adaptive, K, self.token_cost, self.learn_cost)
        self.target = target

    def begin(self, state: DecodeState) -> None:
        self.length.reset()

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        if self.target is None:
            raise RuntimeError("MedusaDrafter.attach(target) must be called before drafting")
        if state.target_hidden is None:  # the target has not read the prompt yet
            return Draft.empty()
        logits = to_full_vocab(self.heads(state.target_hidden[-1].to(self.heads.head.dtype)),
                               self.heads.vocab_ids, self.target.vocab_size)  # [K, V]
        if self.choices is not None:
            return self._tree(logits)
        k = min(self.length.choose(), state.max_depth)
        if k == 0:
            return Draft.empty()
        rows = iter(logits[1:])
        return self.draft_chain(state, logits[0], k, lambda token, more: next(rows))

    def _tree(self, logits: torch.Tensor) -> Draft:
        ranks = max(p[-1] for p in self.choices) + 1
        top = torch.topk(logits, min(ranks, logits.shape[-1]), dim=-1).indices.tolist()  # [K, ranks]
        index = {path: i for i, path in enumerate(self.choices)}
        tokens = [top[len(p) - 1][p[-1]] for p in self.choices]
        parents = [index[p[:-1]] if len(p) > 1 else ROOT for p in self.choices]
        return Draft(torch.tensor(tokens, dtype=torch.long), parents)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        if self.choices is None:  # the length rule models chains
            super().on_commit(draft, verdict, step)
