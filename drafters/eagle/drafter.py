"""``drafter=eagle``: draft from the target's own features with a trained EAGLE head.

Each step the target's verification pass already computes its last-layer features of
the positions it commits; the drafter keeps them (``needs_target_hidden``) and runs a
one-layer `spec_zoo.drafters.eagle.head.EagleHead` over (token, previous feature) pairs: a draft token
costs one decoder layer and a reduced-vocabulary head, a small fraction of a target
forward. The head has its own KV cache; positions it computed from its *own* predicted
features (the drafted ones) are recomputed from the target's true features once they
are committed, so every committed position is drafted from exact inputs.

The first step of a sequence drafts nothing: the target has not read the prompt yet.
With ``tree`` a policy of `spec_zoo.trees` shapes the draft (EAGLE-2: ``tree=dynamic``):
each level is one head forward over the frontier nodes, each reading the head's guessed
feature of its parent, with a tree mask over the head's cache. Exact verifiers stay
exact: q is recorded when sampling and is zero outside the draft vocabulary.

With ``runtime=compiled`` the head runs as one compiled graph on a static KV cache
(`spec_zoo.runtime.compiled_head`), compiled once per process beside the target's: catching up on
the committed tokens, every chain token and every tree level are calls of that graph. An
EAGLE-3 head reads the states entering three of the target's layers: the drafter names them
(`Target.hand_out`), so a compiled target's graph returns them too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from spec_zoo.chain import ChainDrafter
from spec_zoo.costs import file_costs
from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.drafters.eagle.formats import FORMATS, PublishedHead, load_published, sniff
from spec_zoo.drafters.eagle.head import EagleHead, load_eagle
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.lockstep import Steps, answer, drive, relay
from spec_zoo.models import RUNTIMES, check_runtime
from spec_zoo.runtime.attention_kernel import DEFAULT_ATTENTION
from spec_zoo.runtime.compiled_head import CompiledHead, HeadRows
from spec_zoo.runtime.layers import DecoderStack, causal_mask
from spec_zoo.runtime.target import Target, follow
from spec_zoo.sampling import check_sample_mode, drafts_sampled, to_full_vocab
from spec_zoo.trees import TreeLevels, build_tree_policy

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-eagle"


class EagleDrafter(ChainDrafter):
    """head:       an EAGLE-head dir (`spec-zoo-train eagle`, or a published EAGLE-1/2, EAGLE-3 or
                speculators head: `spec_zoo.drafters.eagle.formats`), None (the one shipped for
                SmolLM2-135M), a head module, or a `CompiledHead` of one (its compiled graph
                shared by drafters); it must be trained for this target.
    format:     the layout of ``head``: auto (sniffed from its files), spec_zoo, eagle, eagle3,
                speculators.
    num_draft, adaptive, max_draft, token_cost, learn_cost: the chain length, fixed or chosen
                per step by expected speedup (`spec_zoo.draft_length`).
    sample:     "auto" samples from the head when temperature > 0 (q recorded, so rejection
                sampling stays exact), argmax at 0; True/False force it.
    tree:       a tree policy (`spec_zoo.trees`: ``dynamic``, ``{policy: topk, width: 2}``, ...);
                None drafts a chain.
    runtime:    the head's runtime: ``eager``, or ``compiled`` (one compiled graph on a static KV
                cache, `spec_zoo.runtime.compiled_head`; compiles on first use, float32 or bfloat16 on the CPU).
    """

    name = "eagle"
    artefact_keys = ("head",)
    needs_target_hidden = True

    def __init__(self, head=None, num_draft: int = 4, adaptive: bool = True, max_draft: int = 8,
                 sample: str | bool = "auto", token_cost: float = 0.1, learn_cost: bool = True,
                 tree: str | dict | None = None, format: str = "auto", runtime: str = "eager"):
        check_sample_mode(sample)
        if runtime not in RUNTIMES:
            raise ConfigError(f"drafter.runtime={runtime!r} is not a runtime; use one of: {', '.join(RUNTIMES)}.")
        if format not in FORMATS:
            raise ConfigError(f"drafter.format={format!r}; use one of {', '.join(FORMATS)}.")
        if head is None and format not in ("auto", "spec_zoo"):
            raise ConfigError(f"drafter.format={format} needs drafter.head=PATH (the {format} head's directory).")
        self.tree = build_tree_policy(tree)
        if head is None and not (SHIPPED / EagleHead.RECORD).is_file():
            raise ConfigError(f"the shipped EAGLE head is missing ({SHIPPED}); reinstall spec-zoo, or set "
                              "drafter.head=DIR to a head made with `spec-zoo-train eagle`.")
        self.head_source, self.format, self.sample_mode = head, format, sample
        self.runtime = "compiled" if isinstance(head, CompiledHead) else runtime
        self.compiled: CompiledHead | None = None
        self.length = DraftLength(num_draft, adaptive, max_draft, token_cost, learn_cost)
        self.target: Target | None = None

    def attach(self, target: Target) -> None:
        self.stack = DecoderStack(target.model)
        source = self.head_source
        self.head = self._load(source.head if isinstance(source, CompiledHead) else source, target)
        # a published head keeps its own RoPE and reads from the second token on (as its reference code)
        self._rotary = self.head.rotary if isinstance(self.head, PublishedHead) else self.stack.rotary
        self._shift = int(getattr(self.head, "starts_at_second_token", False))
        layers = getattr(self.head, "target_layers", None)
        target.hand_out(layers)
        self.needs_target_hidden = layers or True
        self._width = self.head.fc.in_features if layers else int(target.model.lm_head.weight.shape[1])
        # a compiled head is fed features of one width: an EAGLE-3 head's fused target states go
        # through its ``fc`` first (`_head`), so every row reads a feature as wide as its own output
        self._fed_width = self.head.fc.out_features if layers else self._width
        self.compiled = self._compiled_head(source, target)
        file_costs(self)
        self.target = target

    def _compiled_head(self, source, target: Target) -> CompiledHead | None:
        """The head's compiled graph (``runtime=compiled``): the one handed in, or a new one."""
        if self.runtime != "compiled":
            return None
        check_runtime("compiled", str(self.head.fc.weight.dtype).removeprefix("torch."), str(target.device),
                      "drafter")
        if isinstance(source, CompiledHead):
            return source
        weights = () if isinstance(self.head, PublishedHead) else (self.stack.inner.rotary_emb,)
        return CompiledHead(self.head, self._rotary, (self.stack.inner.embed_tokens.embedding_dim, self._fed_width),
                            weights, max_cache_len=target.max_length or 2048,
                            attention=getattr(target, "attention", DEFAULT_ATTENTION))  # the target's model.attention

    def compiled_parts(self) -> list[CompiledHead]:
        """The head's compiled graph when it runs compiled: what `spec-zoo warmup` compiles."""
        return [self.compiled] if self.compiled is not None else []

    def _load(self, source, target: Target):
        if isinstance(source, torch.nn.Module):
            return source
        fmt = self.format if source is not None and self.format != "auto" else (
            sniff(source) if source is not None else "spec_zoo")
        if fmt == "spec_zoo":
            return load_eagle(source or SHIPPED, target.model)
        return load_published(source, target.model, fmt)

    # forks (`ChainDrafter.for_sequence`) make their own head cache and features in `begin`; a compiled
    # head's static cache has an entry per sequence (`CompiledHead.sequence`), and a batch's forks
    # draft together (`drafting`): each level of all their drafts is one call of the head's graph
    batches = True

    @property  # computes the attribute Drafter declares
    def drafts_together(self) -> bool:  # type: ignore[override]
        return self.compiled is not None

    def hold(self, sequences: int) -> None:
        if self.compiled is not None:
            self.compiled.hold(sequences)

    def begin(self, state: DecodeState) -> None:
        self.cache = self.compiled.sequence(self.slot) if self.compiled is not None else DynamicCache()
        self._fed: list[int] = []  # tokens whose KV is in the head's cache, in order
        self._exact = 0  # leading positions of the cache computed from the target's true features
        self._features: list[torch.Tensor] = []  # the target's features of positions 0.. (chunks)
        self._seen: torch.Tensor | None = None
        self.length.reset()

    def _head(self, tokens: list[int], features: torch.Tensor, place=None, pick=(-1,)) -> Steps:
        """Feed ``tokens`` with the features of the positions before them ([m, W]); return the
        head's feature guesses [m, H] and its logits (over the target's vocabulary) after the
        rows ``pick``. Without ``place`` they follow the fed tokens causally (and count as
        fed); a tree level brings its own (`TreeLevels`: ``feed`` eagerly, ``place`` compiled).
        Steps (`spec_zoo.lockstep`): a compiled head's calls are yielded as `HeadRows` (a long
        run of tokens as several), for a batch to share; an eager head runs at once."""
        assert self.target is not None  # attached (propose checks)
        past, m = len(self._fed), len(tokens)
        embeds = self.stack.embed(torch.tensor([tokens], device=self.target.device))
        features = features[None].to(embeds.dtype)
        if place is None:
            self._fed += tokens
        if self.compiled is not None:
            if features.shape[-1] != self._fed_width:  # an EAGLE-3 head's fused target states
                features = self.head.fc(features)
            calls = (self.compiled.causal_rows(self.cache, embeds, features, list(pick)) if place is None
                     else [HeadRows(self.compiled, self.cache, embeds, features, place[0], place[1], past, list(pick))])
            for call in calls:
                guess, logits = yield call
        else:
            positions, mask = place or (torch.arange(past, past + m, device=embeds.device)[None],
                                        causal_mask(past, m, embeds.dtype, embeds.device))
            hidden = self.head.inputs(embeds, features)
            out = self.head(hidden, self._rotary(hidden, positions), self.cache, mask)[0]
            guess, logits = self.head.feature(out), self.head.logits(out[list(pick)])
        return guess, self._logits(logits)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [k, V_draft] as logits over the target's vocabulary [k, V]."""
        assert self.target is not None  # attached (propose checks)
        return to_full_vocab(logits, self.head.vocab_ids, self.target.vocab_size)

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        return drive(self.drafting(state), answer)

    @torch.no_grad()
    def drafting(self, state: DecodeState) -> Steps[Draft]:
        """`propose` as steps (`spec_zoo.lockstep`): a compiled head's calls are yielded (`_head`),
        so a batch's sequences make each draft level in one call of its graph."""
        if self.target is None:
            raise RuntimeError("EagleDrafter.attach(target) must be called before drafting")
        if state.target_hidden is not None and state.target_hidden is not self._seen:
            self._features.append(state.target_hidden)
            self._seen = state.target_hidden
        tokens, n = state.tokens, len(state.tokens) - 1
        have = sum(f.shape[0] for f in self._features)
        k = min(self.length.choose(state=state), state.max_depth) if self.tree is None else state.max_depth
        if have == 0 or k == 0:  # nothing read by the target yet, or drafting does not pay now
            return Draft.empty()
        if have != n:
            raise RuntimeError(f"EagleDrafter holds target features of {have} positions but the committed "
                               f"sequence has {n} before its last token; was begin() called for this sequence?")
        features = torch.cat(self._features)
        self._features = [features]
        if features.shape[-1] != self._width:
            raise ConfigError(f"the EAGLE head reads target states of width {self._width} but was handed "
                              f"{features.shape[-1]}; an EAGLE-3 head cannot share a cascade or merge with "
                              "drafters that read other states.")
        # head position j holds token j + shift and the target's state before it (zeros before the first)
        seq = tokens[self._shift:]
        keep = follow(self._fed, seq, min(self._exact, len(seq) - 1), self.cache)
        start = keep - 1 + self._shift
        before = features[start:n] if start >= 0 else torch.cat([features[:1] * 0, features[:n]])
        guess, logits = yield from self._head(seq[keep:], before)
        guess = guess[-1:]
        self._exact = len(seq)
        if self.tree is not None:
            return (yield from relay(self.tree.levels(state, drafts_sampled(self.sample_mode, state.sampling)),
                                     self._tree_expand(guess[0], logits)))

        def advance(ask: tuple[int, bool]) -> Steps[torch.Tensor]:  # the next position reads the head's guessed feature
            nonlocal guess
            guess, logits = yield from self._head([ask[0]], guess)
            return logits[0]

        return (yield from relay(self.chain_steps(state, logits[0], k), advance))

    def _tree_expand(self, root: torch.Tensor, root_logits: torch.Tensor):
        """``expand`` for a tree policy's levels, as steps: a node reads the head's guessed feature
        of its parent (``root``: the last committed position's); the tree's KV sits behind the
        fed tokens until the next step crops it."""
        guesses, levels = {ROOT: root}, TreeLevels(len(self._fed))

        def expand(ask: tuple[Draft, list[int]]) -> Steps[torch.Tensor]:
            tree, nodes = ask
            if nodes == [ROOT]:
                return root_logits
            assert self.target is not None  # attached (propose checks)
            features = torch.stack([guesses[tree.parents[node]] for node in nodes])
            place = (levels.place(tree, nodes) if self.compiled is not None
                     else levels.feed(tree, nodes, features.dtype, self.target.device))
            guess, logits = yield from self._head(tree.tokens[nodes].tolist(), features, place, pick=range(len(nodes)))
            guesses.update(zip(nodes, guess))
            return logits

        return expand
