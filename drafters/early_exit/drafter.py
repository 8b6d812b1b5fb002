"""Self-speculation by early exit (LayerSkip, Elhoushi et al. 2024; Kangaroo, Liu et al. 2024).

The target drafts for itself: its own first E layers, then an exit head, propose tokens
one at a time. The exit head is the target's final norm + LM head on layer E (untrained),
or a trained `spec_zoo.drafters.early_exit.adapter.ExitAdapter`. No second model, no weight copy.

KV reuse (``reuse_kv``, LayerSkip's "shared compute"): the draft pass is the target's own
partial forward (`Target.forward_layers`: layers 0..E-1, KV in the target's cache, written
by the target), so verification resumes from layer E and the shallow layers never run
twice. On rejection the target crops every layer to the accepted length, so the shallow
and deep caches rewind together. With ``reuse_kv=false`` the draft keeps its own shallow
cache and the target verifies with all its layers: the same tokens, more compute.

With ``tree`` a policy of `spec_zoo.trees` shapes the draft: each level is one forward of
the shallow layers (and the adapter) over the frontier nodes, with a tree mask over the
draft's own shallow cache, so trees need ``reuse_kv=false`` (the target's cache holds
chains only, and the target scores a tree from layer 0 anyway).

With ``runtime=compiled`` the draft is one compiled graph on its own static cache
(`spec_zoo.drafters.early_exit.compiled`) and the target verifies with all its layers
(``reuse_kv=false``): beside the compiled target that is faster than an eager resume.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from spec_zoo.chain import ChainDrafter
from spec_zoo.costs import file_costs
from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.drafters.early_exit.adapter import ExitAdapter, check_exit_layer, load_adapter
from spec_zoo.drafters.early_exit.compiled import CompiledExit, ExitDraft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.models import RUNTIMES, check_runtime
from spec_zoo.runtime.attention_kernel import DEFAULT_ATTENTION
from spec_zoo.runtime.compiled_head import CHUNK
from spec_zoo.runtime.layers import causal_mask
from spec_zoo.runtime.target import Target, follow, shared_prefix
from spec_zoo.sampling import check_sample_mode, drafts_sampled, to_full_vocab
from spec_zoo.trees import TreeLevels, build_tree_policy

ARTEFACTS = Path(__file__).parent / "artefacts"
#: exit layers whose adapters shipped once and left the package (no default used them); their
#: records and the command that remakes them: records/README.md in the repository
RETIRED = (4, 12, 16)


def shipped_adapter(exit_layer: int) -> Path:
    """The adapter shipped for SmolLM2-135M at ``exit_layer``."""
    path = ARTEFACTS / f"smollm2-135m-exit{exit_layer}"
    if not path.is_dir() and exit_layer in RETIRED:
        raise ConfigError(f"drafter.adapter=shipped: the exit adapter smollm2-135m-exit{exit_layer} no longer ships "
                          "(only E = 8 does); remake it with `spec-zoo-train early_exit "
                          f"adapter.exit_layer={exit_layer} output.dir=DIR` (its exact recipe and training record: "
                          "records/README.md in the spec-zoo repository) and set drafter.adapter=DIR.")
    if not path.is_dir():
        have = sorted(int(p.name.rsplit("exit", 1)[1]) for p in ARTEFACTS.glob("smollm2-135m-exit*"))
        raise ConfigError(f"drafter.adapter=shipped: no adapter is shipped for exit layer {exit_layer} "
                          f"(shipped: {have or 'none'}); pick one of those exit layers, or train one with "
                          f"`spec-zoo-train early_exit adapter.exit_layer={exit_layer}` and set drafter.adapter=DIR.")
    return path


class EarlyExitDrafter(ChainDrafter):
    """Chain drafting from the target's layer ``exit_layer`` (E, in 1..L-1).

    num_draft, adaptive, max_draft, token_cost, learn_cost: the draft length, fixed or
                chosen per step by expected speedup (`spec_zoo.draft_length`); token_cost
                (target forwards per drafted token) defaults to E/L + 0.1.
    stop_below: stop a draft early when the exit head's top probability falls below this
                (Kangaroo's confidence threshold; 0 = off). The draft length may depend
                on the draft's own distributions, so exactness is unaffected.
    sample:     "auto" samples from the exit head when temperature > 0 (q recorded, so
                rejection sampling stays exact), argmax at 0; True/False force it.
    reuse_kv:   verify from layer E with the draft's shallow KV and states (see above).
    adapter:    None (untrained exit), an adapter directory (`spec-zoo-train early_exit`),
                "shipped" (the one trained for SmolLM2-135M at this exit layer), an
                `ExitAdapter`, or a `CompiledExit` (a compiled draft, with or without an
                adapter, whose graph is shared); it must be trained for this target and exit layer.
    tree:       a tree policy (`spec_zoo.trees`: ``dynamic``, ``{policy: topk, width: 2}``, ...;
                needs ``reuse_kv=false``); None drafts a chain.
    runtime:    the draft's runtime: ``eager``, or ``compiled`` (one graph on a static cache, compiled
                on first use; needs ``reuse_kv=false``, see the module doc).
    """

    name = "early_exit"
    artefact_keys = ("adapter",)

    def __init__(
        self,
        exit_layer: int = 8,
        num_draft: int = 4,
        adaptive: bool = True,
        max_draft: int = 8,
        stop_below: float = 0.0,
        sample: str | bool = "auto",
        reuse_kv: bool = True,
        adapter=None,
        token_cost: float | None = None,
        learn_cost: bool = True,
        tree: str | dict | None = None,
        runtime: str = "eager",
    ):
        check_sample_mode(sample)
        if isinstance(adapter, CompiledExit):
            runtime = "compiled"
        if runtime not in RUNTIMES:
            raise ConfigError(f"drafter.runtime={runtime!r} is not a runtime; use one of: {', '.join(RUNTIMES)}.")
        if runtime == "compiled" and reuse_kv:
            raise ConfigError("drafter.runtime=compiled drafts in its own static cache and the target verifies with "
                              "all its layers: set drafter.reuse_kv=false (batch invariance makes that the same "
                              "tokens; docs/early_exit.md).")
        self.tree = build_tree_policy(tree)
        if self.tree is not None and reuse_kv:
            raise ConfigError("drafter.tree needs drafter.reuse_kv=false: a tree is drafted in the draft's own "
                              "shallow cache (the target's partial forward serves chains only).")
        if not 0.0 <= stop_below < 1.0:
            raise ConfigError(f"drafter.stop_below={stop_below}; it is a probability threshold in [0, 1) (0 = off).")
        if int(exit_layer) < 1:
            raise ConfigError(f"drafter.exit_layer={exit_layer}; the exit must be a layer index >= 1.")
        self.exit_layer, self.stop_below, self.sample_mode = int(exit_layer), stop_below, sample
        self.reuse_kv, self.adapter_source, self.runtime = bool(reuse_kv), adapter, runtime
        self.compiled: CompiledExit | None = None  # set by attach when runtime=compiled
        self.length = DraftLength(num_draft, adaptive, max_draft, 0.5 if token_cost is None else token_cost, learn_cost)
        self._default_cost = token_cost is None
        self.target: Target | None = None
        self.adapter: ExitAdapter | None  # set by attach

    def attach(self, target: Target) -> None:
        self.stack = target.stack  # refuses a family its layer-by-layer forward would get wrong
        check_exit_layer(self.exit_layer, self.stack.num_layers)
        if self.reuse_kv and target.runtime == "compiled" and target.dtype == torch.bfloat16:
            # the verify would resume eagerly from layer E over the eager draft's shallow KV: in bf16 that
            # arithmetic is not the compiled graph's, and the output stops being plain decoding's (4 of 13
            # Spec-Bench prompts equal on the real target)
            raise ConfigError("drafter.reuse_kv=true on a compiled bfloat16 target verifies eagerly from layer "
                              f"{self.exit_layer}, which does not reproduce the compiled graph's bf16 arithmetic (the "
                              "output would differ from plain decoding); set drafter.reuse_kv=false (and "
                              "drafter.runtime=compiled for speed).")
        source = self.adapter_source
        if isinstance(source, CompiledExit):  # a compiled draft handed in: its graph is shared
            if source.head.exit_layer != self.exit_layer:
                raise ConfigError(f"the compiled draft exits at layer {source.head.exit_layer}, not "
                                  f"drafter.exit_layer={self.exit_layer}.")
            self.adapter, self.compiled = source.head.adapter, source
        elif isinstance(source, ExitAdapter):
            if source.exit_layer != self.exit_layer:
                raise ConfigError(f"the adapter was trained for exit layer {source.exit_layer}, not "
                                  f"drafter.exit_layer={self.exit_layer}.")
            self.adapter = source
        elif source in (None, ""):
            self.adapter = None
        else:
            path = shipped_adapter(self.exit_layer) if source == "shipped" else source
            self.adapter = load_adapter(path, target.model, self.exit_layer)
        if self._default_cost:
            self.length.prior_cost = min(0.9, self.exit_layer / self.stack.num_layers + 0.1)
        if self.runtime == "compiled" and not isinstance(source, CompiledExit):
            check_runtime("compiled", str(target.dtype).removeprefix("torch."), str(target.device), "drafter")
            self.compiled = CompiledExit(ExitDraft(target.model, self.exit_layer, self.adapter),
                                         max_cache_len=target.max_length or 2048,
                                         attention=getattr(target, "attention", DEFAULT_ATTENTION))
        file_costs(self, f"-{self.exit_layer}")
        self.target = target

    def compiled_parts(self) -> list[CompiledExit]:
        """The draft's compiled graph when it runs compiled: what `spec-zoo warmup` compiles."""
        return [self.compiled] if self.compiled is not None else []

    # forks (`ChainDrafter.for_sequence`) make their own shallow and adapter caches in `begin`; with KV
    # reuse the shallow KV is in the sequence's own target cache, and a compiled draft's static cache
    # has an entry per sequence (`CompiledHead.sequence`)
    batches = True

    def hold(self, sequences: int) -> None:
        if self.compiled is not None:
            self.compiled.hold(sequences)

    def begin(self, state: DecodeState) -> None:
        # layers 0..E-1 when not reusing the target's cache (the compiled draft's cache holds the adapter's too)
        self._shallow = self.compiled.sequence(self.slot) if self.compiled is not None else DynamicCache()
        self._adapted = DynamicCache()  # the adapter's own layer
        self._fed: list[int] = []  # tokens whose shallow (and adapter) KV is cached, in order
        self.length.reset()

    def _rewind(self, tokens: list[int]) -> int:
        """Crop the shallow and adapter caches to what is still committed; return its length."""
        keep = shared_prefix(self._fed, tokens, len(tokens) - 1)
        if self.reuse_kv:  # the shallow KV lives in the target's cache: the target crops it
            assert self.target is not None  # attached (propose checks)
            return follow(self._fed, tokens, self.target.rewind(tokens, limit=keep), self._adapted)
        return follow(self._fed, tokens, keep, self._shallow, self._adapted)

    def _advance(self, new: list[int], need_logits: bool = True):
        """Run ``new`` tokens through layers 0..E-1 (and the adapter); return the exit logits
        after the last one (or None)."""
        assert self.target is not None  # attached (propose checks)
        device = self.target.device
        if self.compiled is not None:
            embeds = self.stack.embed(torch.tensor([new], device=device))
            if len(new) > CHUNK:  # a prompt's worth: one eager forward (see CompiledExit.prefill)
                self.compiled.prefill(self._shallow, embeds[:, :-1])
                embeds = embeds[:, -1:]
            self._fed += new  # the tokens since the last draft: one call of the graph, about the price of one row
            return self._full(self.compiled.causal(self._shallow, embeds, embeds, [-1])[1][0])
        past, m = len(self._fed), len(new)
        positions = torch.arange(past, past + m, device=device)[None]
        states = self._run(new, positions)
        self._fed += new
        return self._exit_logits(states[-1]) if need_logits else None

    def _run(self, tokens: list[int], positions: torch.Tensor, mask=None) -> torch.Tensor:
        """The exit head's input states [m, H] of ``tokens`` at ``positions`` (KV appended);
        ``mask``: a tree level's mask, None for a chain (the model's own masks, windows included)."""
        assert self.target is not None  # attached (propose checks)
        if self.reuse_kv:  # the target runs its own shallow layers into its own cache
            hidden = self.target.forward_layers(tokens, self.exit_layer)[None]
        else:
            hidden = self.stack.embed(torch.tensor([tokens], device=self.target.device))
            hidden = self.stack.run(hidden, 0, self.exit_layer, positions, self._shallow, mask)
        if self.adapter is not None:
            if mask is None:
                mask = causal_mask(int(positions[0, 0]), len(tokens), self.target.dtype, self.target.device)
            hidden = self.adapter(hidden, self.stack.rotary(hidden, positions), self._adapted, mask)
        return hidden[0]

    def _exit_logits(self, states: torch.Tensor) -> torch.Tensor:
        if self.adapter is None:
            return self.stack.logits(states)
        return self._full(self.adapter.logits(states))

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """The exit head's logits over the target's vocabulary (the adapter's cover its draft vocabulary)."""
        if self.adapter is None:
            return logits
        assert self.target is not None  # attached (propose checks)
        return to_full_vocab(logits, self.adapter.vocab_ids, self.target.vocab_size)

    def _tree_expand(self, root: torch.Tensor):
        """``expand`` for a tree policy: each level one shallow forward of the frontier nodes
        behind the fed tokens (cropped away at the next step)."""
        levels = TreeLevels(len(self._fed))

        def expand(tree: Draft, nodes: list[int]) -> torch.Tensor:
            if nodes == [ROOT]:
                return root[None]
            assert self.target is not None  # attached (propose checks)
            if self.compiled is not None:
                embeds = self.stack.embed(tree.tokens[nodes][None].to(self.target.device))
                slots, paths = levels.place(tree, nodes)
                return self._full(self.compiled.rows(self._shallow, embeds, embeds, slots, paths,
                                                     visible=len(self._fed), pick=list(range(len(nodes))))[1])
            positions, mask = levels.feed(tree, nodes, self.target.dtype, self.target.device)
            return self._exit_logits(self._run(tree.tokens[nodes].tolist(), positions, mask))

        return expand

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        if self.target is None:
            raise RuntimeError("EarlyExitDrafter.attach(target) must be called before drafting")
        tokens = state.tokens
        k = min(self.length.choose(state=state), state.max_depth) if self.tree is None else state.max_depth
        if k == 0 and not self.reuse_kv:  # a plain target step; the shallow cache catches up later
            return Draft.empty()
        keep = self._rewind(tokens)
        logits = self._advance(tokens[keep:], need_logits=k > 0)
        if self.tree is not None:
            return self.tree.build(self._tree_expand(logits), state, drafts_sampled(self.sample_mode, state.sampling))
        stop = (lambda lg: float(lg.softmax(-1).max()) < self.stop_below) if self.stop_below else None
        # with KV reuse the target resumes from every node's layer-E state: feed the last one too
        return self.draft_chain(state, logits, k, lambda token, more: self._advance([token], need_logits=more),
                                stop, advance_last=self.reuse_kv)
