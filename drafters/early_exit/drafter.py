"""Self-speculation by early exit (LayerSkip, Elhoushi et al. 2024; Kangaroo, Liu et al. 2024).

The target drafts for itself: its own first E layers, then an exit head, propose tokens
one at a time. The exit head is the target's final norm + LM head on layer E (untrained),
or a trained `spec_zoo.drafters.early_exit.adapter.ExitAdapter`. No second model, no weight copy.

KV reuse (``reuse_kv``, LayerSkip's "shared compute"): the draft pass writes the KV of
layers 0..E-1 straight into the target's cache and hands the target the states entering
layer E of the new committed tokens and of every draft token (``Draft.prefix``); the
target verifies from layer E on, so the shallow layers never run twice. On rejection the
target crops every layer to the accepted length, so the shallow and deep caches rewind
together. With ``reuse_kv=false`` the draft keeps its own shallow cache and the target
verifies with all its layers: the same tokens, more compute.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.drafters.early_exit.adapter import ExitAdapter, check_exit_layer, load_adapter
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.layers import DecoderStack, LayerStates, causal_mask
from spec_zoo.sampling import check_sample_mode, draft_token, drafts_sampled, to_full_vocab
from spec_zoo.stats import StepStats
from spec_zoo.target import Target, crop_cache, shared_prefix

ARTEFACTS = Path(__file__).parent / "artefacts"


def shipped_adapter(exit_layer: int) -> Path:
    """The adapter shipped for SmolLM2-135M at ``exit_layer``."""
    path = ARTEFACTS / f"smollm2-135m-exit{exit_layer}"
    if not path.is_dir():
        have = sorted(int(p.name.rsplit("exit", 1)[1]) for p in ARTEFACTS.glob("smollm2-135m-exit*"))
        raise ConfigError(f"drafter.adapter=shipped: no adapter is shipped for exit layer {exit_layer} "
                          f"(shipped: {have or 'none'}); pick one of those exit layers, or train one with "
                          f"`spec-zoo-train early_exit adapter.exit_layer={exit_layer}` and set drafter.adapter=DIR.")
    return path


class EarlyExitDrafter(Drafter):
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
                "shipped" (the one trained for SmolLM2-135M at this exit layer), or an
                `ExitAdapter`; it must be trained for this target and exit layer.
    """

    name = "early_exit"

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
    ):
        check_sample_mode(sample)
        if not 0.0 <= stop_below < 1.0:
            raise ConfigError(f"drafter.stop_below={stop_below}; it is a probability threshold in [0, 1) (0 = off).")
        if int(exit_layer) < 1:
            raise ConfigError(f"drafter.exit_layer={exit_layer}; the exit must be a layer index >= 1.")
        self.exit_layer, self.stop_below, self.sample_mode = int(exit_layer), stop_below, sample
        self.reuse_kv, self.adapter_source = bool(reuse_kv), adapter
        self.length = DraftLength(num_draft, adaptive, max_draft, 0.5 if token_cost is None else token_cost, learn_cost)
        self._default_cost = token_cost is None
        self.target: Target | None = None

    def attach(self, target: Target) -> None:
        self.stack = DecoderStack(target.model)
        check_exit_layer(self.exit_layer, self.stack.num_layers)
        source = self.adapter_source
        if isinstance(source, ExitAdapter):
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
        self.target = target

    def begin(self, state: DecodeState) -> None:
        self._shallow = DynamicCache()  # layers 0..E-1 when not reusing the target's cache
        self._adapted = DynamicCache()  # the adapter's own layer
        self._fed: list[int] = []  # tokens whose shallow (and adapter) KV is cached, in order
        self.length.reset()

    def _rewind(self, tokens: list[int]) -> int:
        """Crop the shallow and adapter caches to what is still committed; return its length."""
        keep = shared_prefix(self._fed, tokens, len(tokens) - 1)
        if self.reuse_kv:  # the shallow KV lives in the target's cache: crop all its layers
            keep = self.target.rewind(tokens, limit=keep)
        else:
            crop_cache(self._shallow, keep)
        crop_cache(self._adapted, keep)
        self._fed = self._fed[:keep]
        return keep

    def _advance(self, new: list[int], need_logits: bool = True):
        """Run ``new`` tokens through layers 0..E-1 (and the adapter); return their states
        entering layer E ([m, H]) and the exit logits after the last one (or None)."""
        past, m = len(self._fed), len(new)
        model = self.target.model
        hidden = self.stack.embed(torch.tensor([new], device=model.device))
        positions = torch.arange(past, past + m, device=model.device)[None]
        rotary = self.stack.rotary(hidden, positions)
        mask = causal_mask(past, m, hidden.dtype, hidden.device)
        cache = self.target.cache if self.reuse_kv else self._shallow
        hidden = self.stack.run(hidden, 0, self.exit_layer, positions, cache, mask, rotary)
        self._fed += new
        if self.adapter is not None:
            adapted = self.adapter(hidden, rotary, self._adapted, mask)
            logits = None
            if need_logits:
                logits = to_full_vocab(self.adapter.logits(adapted[0, -1]), self.adapter.vocab_ids,
                                       self.target.vocab_size)
        else:
            logits = self.stack.logits(hidden[0, -1]) if need_logits else None
        return hidden[0], logits

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Draft:
        if self.target is None:
            raise RuntimeError("EarlyExitDrafter.attach(target) must be called before drafting")
        tokens = state.tokens
        k = min(self.length.choose(), state.max_depth)
        if k == 0 and not self.reuse_kv:  # a plain target step; the shallow cache catches up later
            return Draft.empty()
        keep = self._rewind(tokens)
        states, logits = self._advance(tokens[keep:], need_logits=k > 0)
        rows, drafted, qs = [states], [], []
        sampled = drafts_sampled(self.sample_mode, state.sampling)
        for i in range(k):
            if self.stop_below and float(logits.softmax(-1).max()) < self.stop_below:
                break
            token, q = draft_token(logits, sampled, state.sampling, state.generator)
            qs += [q] if q is not None else []
            drafted.append(token)
            if self.reuse_kv or i + 1 < k:  # the target resumes from every node's layer-E state
                states, logits = self._advance([token], need_logits=i + 1 < k)
                rows.append(states)
        prefix = LayerStates(self.exit_layer, torch.cat(rows)) if self.reuse_kv else None
        return Draft.chain(drafted, torch.stack(qs) if qs else None, prefix)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        self.length.update(len(draft), len(verdict.path), seconds=step.draft_s + step.verify_s)
