"""Draft with a smaller causal LM that shares the target's tokenizer (Leviathan et al. 2023).

The draft model runs through the same `Target` wrapper as the target, so its KV cache
follows the committed sequence the same way: each ``propose`` crops the draft cache to
what is still committed and feeds only the new tokens.
"""

from __future__ import annotations

import torch

from spec_zoo.chain import ChainDrafter
from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Verdict
from spec_zoo.sampling import check_sample_mode, drafts_sampled, logits_to_probs, sample
from spec_zoo.stats import StepStats
from spec_zoo.target import Target


class SmallModelDrafter(ChainDrafter):
    """Chain drafting (``tree_depth=0``) or top-k / sampled tree drafting.

    path:       a local HF model directory (safetensors), an already loaded model, or None:
                the default target's first ``draft_layers`` layers (made once, cached).
    num_draft:  chain length (the starting length when ``adaptive``).
    sample:     "auto" samples when temperature > 0 and drafts greedily at 0; True/False force it.
                Sampled drafts record q so rejection sampling stays exact; greedy drafts
                are deterministic (q one-hot), which exact verification also handles.
    token_cost: with ``adaptive``, the cost of one drafted token (a draft forward plus its
                share of the target's scoring) in target forwards, measured online when
                ``learn_cost``; see `spec_zoo.draft_length`.
    tree_width, tree_depth: with tree_depth > 0, each node gets ``tree_width`` children
                (the top-k tokens when drafting greedily, independent samples from q when
                sampling) down to ``tree_depth`` levels: a tree of w + w^2 + ... + w^d nodes.
    """

    name = "small_model"

    def __init__(
        self,
        path=None,
        num_draft: int = 4,
        adaptive: bool = False,
        max_draft: int = 16,
        sample: str | bool = "auto",
        tree_width: int = 1,
        tree_depth: int = 0,
        token_cost: float = 0.3,
        learn_cost: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        draft_layers: int = 4,
    ):
        self.length = DraftLength(num_draft, adaptive, max_draft, token_cost, learn_cost)
        check_sample_mode(sample)
        if tree_width < 1 or tree_depth < 0:
            raise ConfigError(
                f"drafter.tree_width={tree_width}, drafter.tree_depth={tree_depth}: "
                "need tree_width >= 1 and tree_depth >= 0 (0 drafts a chain)."
            )
        self.sample_mode, self.tree_width, self.tree_depth = sample, tree_width, tree_depth
        if isinstance(path, torch.nn.Module):
            model, tokenizer, self.source = path, None, type(path).__name__
        else:
            from spec_zoo.models import load_causal_lm, truncated_draft

            path = truncated_draft(draft_layers) if path is None else path
            model, tokenizer = load_causal_lm(str(path), dtype=dtype, device=device)
            self.source = str(path)
        self.runner = Target(model, tokenizer)

    @property
    def drafts_trees(self) -> bool:
        return self.tree_depth > 0

    def attach(self, target: Target) -> None:
        mine, theirs = self.runner.vocab_size, target.vocab_size
        same_tokenizer = True
        if self.runner.tokenizer is not None and target.tokenizer is not None:
            same_tokenizer = self.runner.tokenizer.get_vocab() == target.tokenizer.get_vocab()
        if mine != theirs or not same_tokenizer:
            raise ConfigError(
                f"drafter.path={self.source} has a vocabulary of {mine} tokens "
                f"({'same' if same_tokenizer else 'different'} tokenizer) but the target has {theirs}: "
                "a draft model must share the target's tokenizer. Pick a draft from the same model family "
                "(e.g. `spec-zoo-make-draft` builds one from the target itself)."
            )

    def begin(self, state: DecodeState) -> None:
        self.runner.reset()
        self.length.reset()

    def draft_logits(self, tokens: list[int], draft: Draft) -> torch.Tensor:
        """Draft-model logits over the target's vocabulary, rows as in `Target.score`.
        Subclasses with a reduced draft vocabulary map their logits back here."""
        return self.runner.score(tokens, draft).logits

    def _next_logits(self, tokens: list[int]) -> torch.Tensor:
        return self.draft_logits(tokens, Draft.empty())[-1]

    def propose(self, state: DecodeState) -> Draft:
        if self.tree_depth:
            return self._propose_tree(state)
        tokens = list(state.tokens)

        def advance(token: int, more: bool) -> torch.Tensor:
            tokens.append(token)
            return self._next_logits(tokens)

        return self.draft_chain(state, self._next_logits(tokens), min(self.length.choose(), state.max_depth), advance)

    def _propose_tree(self, state: DecodeState) -> Draft:
        """Expand level by level; each level scores the tree so far in one draft forward."""
        sampled = drafts_sampled(self.sample_mode, state.sampling)
        depth = min(self.tree_depth, state.max_depth)
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        frontier = {ROOT: self._next_logits(state.tokens)}
        for level in range(depth):
            for parent, logits in frontier.items():
                if sampled:
                    q = logits_to_probs(logits, state.sampling)
                    kids = sample(q.to(state.generator.device).expand(self.tree_width, -1), state.generator).tolist()
                    rows += [q] * self.tree_width
                else:
                    kids = torch.topk(logits, self.tree_width).indices.tolist()
                tokens += kids
                parents += [parent] * len(kids)
            if level + 1 == depth:
                break
            draft = Draft(torch.tensor(tokens), parents)
            logits = self.draft_logits(state.tokens, draft)
            frontier = {i: logits[i + 1] for i in range(len(tokens)) if draft.depths[i] == level}
        return Draft(torch.tensor(tokens, dtype=torch.long), parents, torch.stack(rows) if rows else None)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        if not self.tree_depth:  # the length rule models chains
            super().on_commit(draft, verdict, step)
