"""`Target`: a Hugging Face causal LM with a KV cache that follows the committed sequence.

One method scores everything: ``score(committed, draft)`` feeds whatever committed
tokens are not yet cached (the whole prompt on the first call, afterwards only the
last committed token) followed by the draft nodes, in one forward pass. A chain is a
plain causal forward; a tree gets a 4-D attention mask (each node sees the cache, the
new committed tokens and its own ancestors) and per-node position ids.
``commit(path)`` then leaves the cache holding exactly the accepted path.

The same class drives draft models (see ``drafters/small_model.py``): a draft model is
just another causal LM whose cache must follow the committed sequence.

A self-speculative drafter (``drafters/early_exit/``) asks the target for a partial
forward, ``forward_layers(tokens, E)``: layers 0..E-1 only, their KV written into this
cache by the target itself, the states entering layer E kept by its `PartialForward`
(``spec_zoo.partial``). The next ``score`` whose new positions are those tokens resumes at
layer E (KV reuse); anything else drops them. The shallow layers may hold more KV than the
deep ones meanwhile, so every crop here is to an absolute length, which keeps all layers
consistent on rejection.

Sliding-window attention (Mistral, Gemma 2/3, Qwen2 windows, Phi-3): transformers' sliding
cache layers drop the KV that leaves the window, so a rejected draft could not be undone
(their ``crop`` refuses). The cache here keeps every layer's full KV and the window lives in
the masks (the model's own mask functions, and tree masks built per layer type), so
rollback is a plain crop. The cost: sliding layers hold and read the whole sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from transformers import DynamicCache

from spec_zoo.draft import Draft
from spec_zoo.partial import PartialForward
from spec_zoo.runtime.layers import DecoderStack, layer_types


def shared_prefix(a: list[int], b: list[int], bound: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``bound``."""
    n, bound = 0, min(len(a), len(b), bound)
    while n < bound and a[n] == b[n]:
        n += 1
    return n


def crop_cache(cache, length: int) -> None:
    """Cut every layer of ``cache`` to ``length`` positions (layers may differ in length:
    a self-speculative draft's shallow layers run ahead of the deep ones)."""
    for layer in cache.layers:
        extra = int(layer.get_seq_length()) - length  # a static layer's length is a tensor
        if extra > 0:
            layer.crop(-extra)


def follow(fed: list[int], committed: list[int], bound: int, *caches) -> int:
    """Keep, in ``fed`` (the tokens whose KV the ``caches`` hold, in order) and in every cache,
    only the longest prefix that is still committed, at most ``bound`` tokens; return its
    length. After a rejection this drops the KV of the rejected draft tokens and nothing else."""
    keep = shared_prefix(fed, committed, bound)
    for cache in caches:
        crop_cache(cache, keep)
    del fed[keep:]
    return keep


def layer_states(hidden_states: tuple, hidden) -> torch.Tensor:
    """From a forward's ``hidden_states`` (transformers' tuple: entry i enters layer i, the last
    is the final norm's output), [B, T, W]: ``True`` = the last entry (what the LM head reads), a
    tuple of layer ids = the states entering those layers side by side (EAGLE-3 heads fuse a low,
    a middle and a high layer)."""
    if hidden is True:
        return hidden_states[-1]
    return torch.cat([hidden_states[i] for i in hidden], dim=-1)


def target_states(hidden_states: tuple, hidden) -> torch.Tensor | None:
    """What ``score(hidden=...)`` asks of a forward's ``hidden_states`` (`layer_states` of its
    one sequence); falsy = None."""
    return layer_states(hidden_states, hidden)[0] if hidden else None


@dataclass
class NextLogits:
    """An ask (`spec_zoo.lockstep`): the logits after ``tokens`` of the sequence whose state
    ``state`` is (`Target.sequence`, updated as it is fed), answered by ``server``, the target
    (a draft model) holding it: a batch's draft models feed their next tokens in one forward.
    With ``draft`` (a parallel draft's mask tokens), the rows after each of its nodes too."""

    server: Target
    state: dict
    tokens: list[int]
    draft: Draft = field(default_factory=Draft.empty)


@dataclass
class Scores:
    """Output of `Target.score`.

    logits: [len(draft) + 1, V]: row 0 after the last committed token, row i + 1 after node i.
    hidden: [m + len(draft), H] last-layer hidden states of every fed position (the m
            newly cached committed tokens, then the nodes), or None when not requested;
            [m + len(draft), k * H] when `score` was asked for k layers (`target_states`).
    new_committed: m, the number of committed tokens fed in this call.
    """

    logits: torch.Tensor
    hidden: torch.Tensor | None
    new_committed: int


#: the attributes `Target.reset` makes fresh: one sequence's state
SEQUENCE_STATE = ("cache", "cached_tokens", "_pending", "_base", "partial")


class Target:
    """Owns a causal LM and its KV cache (one sequence, batch size 1)."""

    runtime = "eager"
    #: whether it holds several sequences' caches at once (`sequence`/`use`); a runtime that does
    #: not decodes a batch's requests one after another
    holds_many = True
    context_limit = "the model's max_position_embeddings"  # what bounds ``max_length``, for errors
    weights = "dense"  # its linear layers' width (model.weights: `spec_zoo.runtime.quant_gemm.WEIGHTS`)
    auto: Mapping[str, str] = MappingProxyType({})  # what each model setting given as auto became (`host_fit`)

    def __init__(self, model, tokenizer=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().out_features
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.forwards = 0
        self._stack: DecoderStack | None = None  # layer access, built (and checked) on first use
        self.layer_types = layer_types(model.config)
        self.reset()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def reset(self, slot: int = 0) -> None:
        """Forget the sequence: a fresh, empty cache (for the ``slot``-th sequence decoded at once)."""
        self.cache = self._fresh_cache(slot)  # the KV cache
        self.cached_tokens: list[int] = []  # token ids whose KV the cache holds, in order
        self._pending: Draft | None = None  # last scored draft, whose nodes sit in the cache
        self._base = 0  # committed tokens in the cache when _pending was scored
        self.partial = PartialForward()  # tokens after `cached_tokens` whose KV is only in layers < E

    def sequence(self) -> dict:
        """The current sequence's state (its cache and what the cache holds), to `use` again
        after serving other sequences: each request of a batch keeps its own cache."""
        return {name: getattr(self, name) for name in SEQUENCE_STATE}

    def use(self, state: dict) -> None:
        """Resume the sequence whose state `sequence` returned."""
        for name, value in state.items():
            setattr(self, name, value)

    def hold(self, sequences: int) -> None:
        """Make room for ``sequences`` sequences decoded at once (each a `reset` slot); here every
        sequence has its own cache, so there is nothing to do."""

    def _fresh_cache(self, slot: int = 0):
        # no config: every layer a full `DynamicLayer`, sliding ones included, so any crop works
        return DynamicCache()

    @property
    def stack(self) -> DecoderStack:
        """The model's layers for partial forwards, checked once against the model's own
        forward (a family this path would get wrong is refused here, before any work)."""
        if self._stack is None:
            stack = DecoderStack(self.model)
            stack.check()
            self._stack = stack
        return self._stack

    def rewind(self, committed: list[int], limit: int | None = None) -> int:
        """Crop every layer's cache to the longest cached prefix of ``committed`` (at most
        ``limit`` tokens, and never the last committed token, whose logits are needed);
        return its length."""
        bound = len(committed) - 1 if limit is None else min(limit, len(committed) - 1)
        keep = follow(self.cached_tokens, committed, bound, self.cache)
        self._pending = None
        self.partial.clear()
        return keep

    @torch.no_grad()
    def forward_layers(self, tokens: list[int], end: int) -> torch.Tensor:
        """Run ``tokens`` through layers 0..end-1 after the cached and earlier partial tokens,
        writing their KV into this cache; return their states entering layer ``end``
        ([len(tokens), H]). A following `score` whose new committed tokens and draft nodes are
        these tokens resumes at layer ``end`` instead of running them again (KV reuse)."""
        past = len(self.cached_tokens) + len(self.partial.tokens)
        return self.partial.run(self.stack, self.cache, tokens, end, past, self.layer_mask(past, len(tokens)))

    @torch.no_grad()
    def score(self, committed: list[int], draft: Draft, hidden: bool | tuple[int, ...] = False) -> Scores:
        """Logits after the last committed token and after every draft node, in one forward;
        with ``hidden``, the target's states too (`target_states`)."""
        if not committed:
            raise ValueError("score() needs at least one committed token (an empty prompt?)")
        if q := self.partial.resumable(self.cached_tokens, committed, draft):
            return self._resume(committed, draft, q, hidden)
        new = committed[self.rewind(committed) :]
        logits, states = self._forward(new, draft, len(self.cached_tokens), hidden)
        self.forwards += 1
        self._scored(committed, draft)
        return Scores(logits, states, len(new))

    def together(self, asks: list[NextLogits]) -> list[torch.Tensor]:
        """Each ask's logits ([1 + len(draft), V]: after its tokens, then after each draft node),
        every sequence scored in one `score_batch` (one graph call on the compiled runtime, whose
        rows are batch invariant: each gets what it gets alone)."""
        return [scored.logits for scored in self.score_batch([(ask.state, ask.tokens, ask.draft) for ask in asks])]

    def hand_out(self, layers: tuple[int, ...] | None) -> None:
        """Say which layers' entering states ``score(hidden=...)`` will ask for (None: the last
        layer's), before anything is timed. The eager forward hands out any it is asked, so
        nothing to do; a compiled runtime compiles the graph that hands them out."""

    @torch.no_grad()
    def score_batch(self, batch: list[tuple[dict | None, list[int], Draft]],
                    hidden: bool | tuple[int, ...] = False) -> list[Scores]:
        """`score` for each sequence of a batch: (its state from `sequence`, updated in place, or None
        for the sequence held now; its committed tokens; its draft). One after another here; a runtime
        that scores them in one forward overrides it (`spec_zoo.runtime.CompiledTarget`)."""
        results = []
        for state, committed, draft in batch:
            if state is not None:
                self.use(state)
            results.append(self.score(committed, draft, hidden))
            if state is not None:
                state.update(self.sequence())
        return results

    def _forward(self, new: list[int], draft: Draft, past: int, hidden: bool | tuple[int, ...]):
        """(logits [len(draft) + 1, V], last-layer states [len(new) + len(draft), H] or None)
        for ``new`` committed tokens and the draft nodes after ``past`` cached tokens; their
        KV is appended to the cache. The runtime's one job (`spec_zoo.runtime.compiled` compiles it)."""
        m, n = len(new), len(draft)
        ids = torch.tensor([new + draft.tokens.tolist()], device=self.device)
        kwargs = {}
        if not draft.is_chain:
            depths = torch.tensor(draft.depths, dtype=torch.long)
            positions = torch.cat([torch.arange(past, past + m), past + m + depths])
            kwargs["position_ids"] = positions.unsqueeze(0).to(self.device)
            kwargs["attention_mask"] = self._tree_mask(past, m, draft)
        out = self.model(
            input_ids=ids,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=hidden,
            logits_to_keep=n + 1,
            **kwargs,
        )
        return out.logits[0], target_states(out.hidden_states, hidden)

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [len(tokens), V] after each of ``tokens`` fed after what the cache holds, at
        ``positions`` under the additive ``mask`` (a draft model's next tree level,
        `spec_zoo.trees.TreeLevels`). Their KV is appended but not counted as cached, so the
        next `score` crops it. Eager runtime only (a static cache scores the tree instead)."""
        out = self.model(input_ids=tokens[None].to(self.device), cache=self.cache, use_cache=True,
                         position_ids=positions, attention_mask=mask, logits_to_keep=len(tokens))
        return out.logits[0]

    def _resume(self, committed: list[int], draft: Draft, q: int, hidden: bool | tuple[int, ...]) -> Scores:
        """Score a chain from the partial forward's layer on: the first ``q`` partial tokens
        are the new committed tokens and the nodes; their lower layers already ran."""
        if hidden not in (True, False):
            raise RuntimeError("a partial forward keeps only the last layer's states; "
                               "score(hidden=layers) needs a full one")
        past, n = len(self.cached_tokens), len(draft)
        crop_cache(self.cache, past + q)  # shallow KV of nodes cut from the draft, if any
        logits, normed = self.partial.resume(self.stack, self.cache, past, q, n, self.layer_mask(past, q))
        self.forwards += 1
        self._scored(committed, draft)
        return Scores(logits, normed if hidden else None, q - n)

    def layer_mask(self, past: int, q: int) -> torch.Tensor | None:
        """The mask of a partial forward of ``q`` positions after ``past`` cached ones; None:
        the model's own masks (full or sliding per layer, `DecoderStack.masks`)."""
        return None

    def _scored(self, committed: list[int], draft: Draft) -> None:
        # a chain is a valid continuation, so keep it as cached tokens: the next rewind
        # reuses its accepted prefix even without commit(); a tree needs commit()
        self.cached_tokens = list(committed) + (draft.tokens.tolist() if draft.is_chain else [])
        self._pending, self._base = draft, len(committed)

    def _tree_mask(self, past: int, m: int, draft: Draft):
        """Additive [1, 1, m + n, past + m + n] mask for a tree after m new committed tokens;
        a dict by layer type when the model mixes full and sliding-window layers."""
        n = len(draft)
        allowed = torch.zeros(m + n, past + m + n, dtype=torch.bool)
        allowed[:, :past] = True
        allowed[:m, past : past + m] = torch.ones(m, m, dtype=torch.bool).tril()
        allowed[m:, past : past + m] = True
        allowed[m:, past + m :] = draft.ancestors_mask()
        # a node's place in its path read as a chain: sliding windows count back from there
        depths = torch.tensor(draft.depths, dtype=torch.long)
        places = torch.cat([torch.arange(past + m), past + m + depths])
        masks = {kind: self._additive(allowed & (places[past:, None] - places[None, :] < self._window(kind)))
                 for kind in set(self.layer_types)}
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def _window(self, kind: str) -> float:
        return self.config.get_text_config().sliding_window if kind == "sliding_attention" else float("inf")

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device)

    def commit(self, path: list[int]) -> None:
        """Keep only the accepted nodes of the last scored draft in the cache."""
        draft, base = self._pending, self._base
        self._pending = None
        if draft is None:
            raise RuntimeError("commit() without a scored draft")
        if path == list(range(len(path))):  # nodes stored in order: a crop suffices
            crop_cache(self.cache, base + len(path))
        else:  # gather the accepted nodes' KV into place behind the committed prefix, then crop
            keep = torch.tensor([base + i for i in path], dtype=torch.long, device=self.device)
            rows = slice(base, base + len(path))
            for layer in self.cache.layers:
                if int(layer.get_seq_length()) == 0:
                    continue
                layer.keys[..., rows, :] = layer.keys[..., keep, :]  # in place: a static cache keeps its address
                layer.values[..., rows, :] = layer.values[..., keep, :]
            crop_cache(self.cache, base + len(path))
        self.cached_tokens = self.cached_tokens[:base] + [int(draft.tokens[i]) for i in path]
