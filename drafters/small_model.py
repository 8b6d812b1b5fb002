"""Draft with a smaller causal LM that shares the target's tokenizer (Leviathan et al. 2023).

The draft model runs through the same `Target` wrapper as the target, so its KV cache
follows the committed sequence the same way: each ``propose`` crops the draft cache to
what is still committed and feeds only the new tokens.
"""

from __future__ import annotations

import torch

from spec_zoo.chain import ChainDrafter
from spec_zoo.costs import file_costs
from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.lockstep import Steps, answer, drive, relay
from spec_zoo.models import other_vocabulary
from spec_zoo.runtime.target import NextLogits, Target
from spec_zoo.sampling import check_sample_mode, drafts_sampled
from spec_zoo.trees import DraftTreeForward, TopK, build_tree_policy, tree_so_far


class DraftModelSequences(ChainDrafter):
    """What a drafter that drafts with a causal LM run as a `Target` (``runner``) needs to batch:
    each sequence in its own cache entry of the draft model (`Target.hold`; entry ``slot``, swapped
    in with `Target.use` around each draft) and with its own draft-length estimates and tree
    policy; the model (and a compiled draft's graph) is shared. Alone it is entry 0."""

    runner: Target
    length: DraftLength
    batches = True

    def hold(self, sequences: int) -> None:
        self.runner.hold(sequences)

    def begin(self, state: DecodeState) -> None:
        self.runner.reset(self.slot)
        self._held = self.runner.sequence()
        self.length.reset()

    def propose(self, state: DecodeState) -> Draft:
        self.runner.use(self._held)  # the draft model holds this sequence's cache while it drafts
        try:
            return self._draft(state)
        finally:
            self._held = self.runner.sequence()

    def _draft(self, state: DecodeState) -> Draft:
        """The draft after ``state.tokens``, the draft model holding this sequence's cache."""
        raise NotImplementedError


class SmallModelDrafter(DraftModelSequences):
    """Chain drafting (adaptive length) or tree drafting by a policy (`spec_zoo.trees`).

    path:       a local HF model directory (safetensors), an already loaded model, a `Target`
                wrapping one (its runtime then serves as is: one compiled draft shared by
                drafters), or None: the default target's first ``draft_layers`` layers (made once, cached).
    num_draft:  chain length (the starting length when ``adaptive``).
    sample:     "auto" samples when temperature > 0 and drafts greedily at 0; True/False force it.
                Sampled drafts record q so rejection sampling stays exact; greedy drafts
                are deterministic (q one-hot), which exact verification also handles.
    token_cost: with ``adaptive``, the cost of one drafted token (a draft forward plus its
                share of the target's scoring) in target forwards, measured online when
                ``learn_cost``; see `spec_zoo.draft_length`.
    tree:       a tree policy (`spec_zoo.trees`: an option of conf/tree/ such as ``dynamic``,
                or ``{policy: topk, width: 3}``); None drafts a chain of ``num_draft``.
                The draft model runs one forward per tree level, with tree attention.
    runtime:    the draft model's runtime, ``eager`` or ``compiled`` (`spec_zoo.runtime.compiled`,
                default buckets and cache length; compiles on first use).
    tree_width, tree_depth: shorthand for ``tree={policy: topk, width: w, depth: d}`` when
                tree_depth > 0 (the top-w tokens when drafting greedily, w draws without
                replacement when sampling): a tree of w + w^2 + ... + w^d nodes.
    """

    name = "small_model"

    def __init__(
        self,
        path=None,
        num_draft: int = 4,
        adaptive: bool = False,
        max_draft: int = 16,
        sample: str | bool = "auto",
        tree: str | dict | None = None,
        tree_width: int = 1,
        tree_depth: int = 0,
        token_cost: float = 0.3,
        learn_cost: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        draft_layers: int = 4,
        runtime: str = "eager",
    ):
        self.length = DraftLength(num_draft, adaptive, max_draft, token_cost, learn_cost)
        check_sample_mode(sample)
        if tree_width < 1 or tree_depth < 0:
            raise ConfigError(
                f"drafter.tree_width={tree_width}, drafter.tree_depth={tree_depth}: "
                "need tree_width >= 1 and tree_depth >= 0 (0 drafts a chain)."
            )
        if tree is not None and tree_depth:
            raise ConfigError(f"drafter.tree={tree!r} and drafter.tree_depth={tree_depth}: give one "
                              "(tree_width/tree_depth are shorthand for tree={policy:topk,...}).")
        self.sample_mode = sample
        self.tree = build_tree_policy(tree) or (TopK(tree_width, tree_depth) if tree_depth else None)
        self.runner, self.source = self.draft_model(path, dtype, device, draft_layers, runtime)

    def draft_model(self, path, dtype: str, device: str, draft_layers: int, runtime: str) -> tuple[Target, str]:
        """The draft model as a `Target` and what to call it (`draft_runner`); a drafter whose draft
        is made from the target overrides this and makes it in `attach`."""
        return draft_runner(path, dtype, device, draft_layers, runtime)

    def attach(self, target: Target) -> None:
        mine, theirs = self.runner.vocab_size, target.vocab_size
        same_tokenizer = not other_vocabulary(self.runner.tokenizer, target.tokenizer)
        if mine != theirs or not same_tokenizer:
            raise ConfigError(
                f"drafter.path={self.source} has a vocabulary of {mine} tokens "
                f"({'same' if same_tokenizer else 'different'} tokenizer) but the target has {theirs}: "
                "a draft model must share the target's tokenizer. Pick a draft from the same model family "
                "(e.g. `spec-zoo-make-draft` builds one from the target itself), or draft across vocabularies "
                "with drafter=cross_tokenizer."
            )
        file_costs(self)

    def compiled_parts(self) -> list[Target]:
        """The draft model when it runs compiled (``runtime=compiled``): what `spec-zoo warmup` compiles."""
        return [self.runner] if hasattr(self.runner, "warm_up") else []

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft model's logits as logits over the target's vocabulary (identity here;
        a drafter with a reduced draft vocabulary maps them back)."""
        return logits

    # a compiled draft model drafts a batch together: each next token of every sequence's chain,
    # or each level of every sequence's tree, is one call of its graph (`drafting`)
    @property  # computes the attribute Drafter declares
    def drafts_together(self) -> bool:  # type: ignore[override]
        return self.runner.runtime == "compiled"

    def _draft(self, state: DecodeState) -> Draft:
        if self.tree is not None and not self.drafts_together:  # eager: each level feeds only its nodes
            expand = DraftTreeForward(self.runner, state.tokens, self.to_target_vocab)
            return self.tree.build(expand, state, drafts_sampled(self.sample_mode, state.sampling))
        return drive(self._steps(state), answer)

    def drafting(self, state: DecodeState) -> Steps[Draft]:
        """`propose` as steps (`spec_zoo.lockstep`): the draft model's calls are asked
        (`NextLogits`), so a batch's sequences feed each next token, or each tree level, in one forward."""
        if not self.drafts_together:
            return (yield from super().drafting(state))
        return (yield from self._steps(state))

    def _steps(self, state: DecodeState) -> Steps[Draft]:
        return (yield from self._chain(state) if self.tree is None else self._tree(state))

    def _tree(self, state: DecodeState) -> Steps[Draft]:
        assert self.tree is not None
        expand = tree_so_far(self.runner, self._held, list(state.tokens), self.to_target_vocab)
        return (yield from relay(self.tree.levels(state, drafts_sampled(self.sample_mode, state.sampling)), expand))

    def _chain(self, state: DecodeState) -> Steps[Draft]:
        tokens = list(state.tokens)

        def next_logits() -> Steps[torch.Tensor]:
            return self.to_target_vocab((yield NextLogits(self.runner, self._held, list(tokens)))[-1])

        def advance(ask: tuple[int, bool]) -> Steps[torch.Tensor]:
            tokens.append(ask[0])
            return (yield from next_logits())

        k = min(self.length.choose(state=state), state.max_depth)
        if k == 0:  # no draft pays: the draft model is not run; it takes what it missed in one forward when one does
            return Draft.empty()
        first = yield from next_logits()
        return (yield from relay(self.chain_steps(state, first, k), advance))


def draft_runner(path, dtype: str, device: str, draft_layers: int, runtime: str) -> tuple[Target, str]:
    """The draft model as a `Target` on ``runtime`` (a given `Target` as is), and what to call it."""
    if isinstance(path, Target):
        return path, type(path.model).__name__
    if isinstance(path, torch.nn.Module):
        model, tokenizer, source = path, None, type(path).__name__
    else:
        from spec_zoo.models import load_causal_lm, truncated_draft

        path = truncated_draft(draft_layers) if path is None else path
        model, tokenizer = load_causal_lm(str(path), dtype=dtype, device=device, key="drafter")
        source = str(path)
    from spec_zoo.models import check_runtime, on_runtime

    check_runtime(runtime, dtype, device, "drafter")
    return on_runtime(runtime, model, tokenizer), source  # compiled: the draft's steps cost less too
