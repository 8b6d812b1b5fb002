"""The compiled runtime: a static KV cache and one inductor graph for every scored-token count.

On a CPU, eager PyTorch makes scoring 2-3 tokens cost 1.7-2x one token (MKL switches
kernels), which eats what speculation saves. Inductor's C++ micro-GEMM reads the weights
once per block of rows, so a few scored tokens cost about what one does, and each row's
arithmetic does not depend on how many rows were scored with it (batch invariance): a
speculative run then equals plain decoding on this runtime bit for bit. This is
gpt-fast's recipe (static cache + ``torch.compile``) on the model's own modules.

`CompiledTarget` keeps `Target`'s contract and changes only how a forward runs:

- The cache is a transformers `Cache` of `StaticLayer`s of ``max_cache_len`` positions (+ one key block). Cropping moves
  its length; committing a tree path gathers the accepted rows into place (`Target.commit`).
- The last committed token and the draft nodes (M rows) go through one compiled graph whose
  row count and attention span are dynamic dimensions: one compile serves every M, with the
  same kernels (a graph per M let inductor pick another GEMM for one row). With float weights a
  single row runs padded to 2 (``buckets``); padding rows attend to the cache only and their KV
  lands past the sequence, where the mask hides it until it is overwritten. With quantized
  weights (`spec_zoo.runtime.quant_gemm`), whose kernel pays for every row, the row count is an unbacked
  dimension that may be 1 and nothing is padded (``buckets="auto"``).
- Attention (`rowwise_attention`) reads the committed prefix's slots, rounded up to
  ``key_block``, in slot order, and each row's draft path root first, so a row's arithmetic
  depends neither on M nor on the tree around it. In float32 and bfloat16 it runs as one C++ kernel
  (`spec_zoo.runtime.attention_kernel`, ``model.attention=kernel``, the default), which reads each key
  once for all rows; inductor's loops for the formula read it once per row.
- A batch of sequences (`score_batch`): the cache has one entry per sequence (`hold`), each
  sequence sees its entry through a `SlotCache` with its own length, and every sequence's rows go
  through the one graph together, each row naming its entry (``row_cache``) and the slot its KV is
  written to (``write_at``). A row's arithmetic depends on neither, so each sequence's rows are the
  ones it gets scored alone (docs/batching.md). One sequence is a batch of one through the same graph.
- States: scoring hands out the last layer's (after the final norm), or, for a drafter that
  named layers when it attached (`hand_out`: an EAGLE-3 head), the states entering them side by
  side; each set is its own graph (`_graph`), compiled at its first use, with the same logits.
- Committed tokens before the last one: a few (up to ``CATCH_UP``: a draft model catching up
  on the tokens accepted since its last draft) ride in the same graph call as a chain ahead of
  the last token and the draft, so a draft model pays one compiled call per draft, not an eager
  forward, nor two calls, each time its whole draft was accepted; more (the prompt) are
  prefilled eagerly into the same cache, one long forward that runs once per prompt. Plain and
  speculative decoding read a prompt alike, so they still match bit for bit.

Families: any model `spec_zoo.runtime.layers.DecoderStack` serves (refused otherwise, before any
work). Attention soft-capping (Gemma 2) is applied as the model's own attention does; the
logits get the model's post-processing (`spec_zoo.runtime.layers.final_logits`). Every layer gets a
full static cache and one mask, so a sliding window must be at least ``max_cache_len`` (it
then never cuts anything); a shorter one is refused with the fix.

The graph compiles once per process, and is read from inductor's on-disk FX graph cache when
another process compiled the same weights before (`spec_zoo.runtime.compile_cache`); `warm_up`
compiles ahead of time and says how long it took and whether the cache served it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
import time
import warnings
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config
from transformers import AttentionInterface
from transformers.cache_utils import Cache, StaticLayer
from transformers.utils import output_capturing

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.amx_gemm import AmxLinears
from spec_zoo.runtime.attention_kernel import ATTENTIONS, DEFAULT_ATTENTION, attend
from spec_zoo.runtime.attention_kernel import load as load_attention
from spec_zoo.runtime.compile_cache import cached_compile, fingerprint, inductor_cache_dir
from spec_zoo.runtime.layers import DecoderStack, causal_mask, final_logits
from spec_zoo.runtime.quant_gemm import QuantLinear
from spec_zoo.runtime.skinny_gemm import SkinnyLinears
from spec_zoo.runtime.target import Scores, Target

KEY_BLOCK = 64  # attention spans a multiple of this many cache slots (a multiple of every SIMD width)
DRAFT_BLOCK = 16  # draft paths are gathered in blocks of this many slots (float32 lanes of AVX-512, 2x AVX2's)
CATCH_UP = 16  # committed tokens scored by the compiled graph, as a chain, before the last one; more: eagerly
# a single row runs as 2: a row count the compiler may see as 1 must be an unbacked dimension (bucket 1), whose
# graph compiles slower and whose float GEMM ran slower here; rows on the quantized kernel cost each (`auto`: 1)
DEFAULT_BUCKETS = (2,)
# model.gemm: inductor's own GEMM (per model.gemm_backends), spec-zoo's float32 skinny GEMM, or its bf16 AMX GEMM.
# inductor's is the default: faster at one row on AVX2 and on AVX-512; the skinny GEMM's flatter curve past 4 rows
# on AVX-512 did not make speculation faster in a Spec-Bench run (docs/runtime.md)
GEMMS = {"inductor": None, "skinny": "float32", "amx": "bfloat16"}  # each GEMM and the one dtype it computes in
DEFAULT_GEMM = "inductor"


def rowwise_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, draft_slots=None,
                      draft_mask=None, softcap=None, sliding_window=None, kernel=False, row_cache=None, **kwargs):
    """Attention whose every output row is computed on its own, as fused multiply-and-sum
    reductions over the key axis: inductor generates the same loop for a row whatever the
    number of rows, which the CPU SDPA kernel (another blocking per query length) does not.

    The keys come in two parts, one softmax over both (their max and sums combined; a part
    a row cannot see adds exact zeros). The committed prefix: the first S cache slots
    (S = ``attention_mask``'s last dim), read by every row in slot order, a plain vectorised
    reduction. The draft nodes: ``draft_slots`` [M, N] lists each row's path root first, so
    a tree node sums its ancestors in the order its path scored as a chain (or plain decoding)
    does, bit for bit; only these N slots are gathered (gathering all S made attention 5x
    slower). query [B, H, M, D]; key, value [B, Hkv, slots, D]; attention_mask additive
    [B, 1, 1, S] (or [B, 1, M, S], a row each); draft_mask additive [M, N]. ``row_cache`` [M]: a packed
    batch of sequences (B = 1), row m reading cache entry ``row_cache[m]`` (key, value [C, Hkv, slots, D])
    under its own mask row. ``softcap``: the model's attention soft-capping
    (Gemma 2), tanh(s / c) * c on the scaled scores before the mask, as its own attention does;
    ``sliding_window`` needs nothing here (`CompiledTarget` refuses windows shorter than its cache).
    ``kernel``: in float32 or bfloat16, the same contract in one C++ kernel (`spec_zoo.runtime.attention_kernel`),
    which reads each key once for all rows; inductor's loops for the formula below read it once per row."""
    if kernel and query.dtype in (torch.float32, torch.bfloat16):
        out = attend(query, key, value, attention_mask, scaling, draft_slots, draft_mask, softcap, row_cache)
        return out.transpose(1, 2), None
    b, heads, m, d = query.shape
    groups = heads // key.shape[1]
    span = attention_mask.shape[-1]
    q = query.reshape(b, key.shape[1], groups, m, 1, d)
    if row_cache is None:
        prefix_k, prefix_v = key[:, :, None, None, :span], value[:, :, None, None, :span]  # [B, Hkv, 1, 1, S, D]
        draft_k = key[:, :, draft_slots].unsqueeze(2)  # [B, Hkv, 1, M, N, D]
        draft_v = value[:, :, draft_slots].unsqueeze(2)
    else:  # each row its own cache entry: [1, Hkv, 1, M, S or N, D]
        prefix_k, prefix_v = (x[row_cache, :, :span].transpose(0, 1)[None, :, None] for x in (key, value))
        draft_k, draft_v = (x[row_cache[:, None], :, draft_slots].permute(2, 0, 1, 3)[None, :, None]
                            for x in (key, value))
    prefix, drafts = (q * prefix_k).sum(-1) * scaling, (q * draft_k).sum(-1) * scaling
    if softcap is not None:
        prefix, drafts = torch.tanh(prefix / softcap) * softcap, torch.tanh(drafts / softcap) * softcap
    prefix = prefix.float() + attention_mask[:, :, None]  # [B, Hkv, G, M, S]
    drafts = drafts.float() + draft_mask  # [B, Hkv, G, M, N]
    top = torch.maximum(prefix.amax(-1, keepdim=True), drafts.amax(-1, keepdim=True))
    prefix, drafts = torch.exp(prefix - top), torch.exp(drafts - top)
    total = prefix.sum(-1, keepdim=True) + drafts.sum(-1, keepdim=True)
    out = ((prefix.unsqueeze(-1) * prefix_v).sum(-2) + (drafts.unsqueeze(-1) * draft_v).sum(-2)) / total
    return out.to(query.dtype).reshape(b, heads, m, d).transpose(1, 2), None


AttentionInterface.register("spec_zoo_rowwise", rowwise_attention)
AttentionInterface.register("spec_zoo_rowwise_kernel", functools.partial(rowwise_attention, kernel=True))


def inductor_settings(freezing: bool, gemm_backends: str) -> dict:
    """The inductor knobs that matter on a CPU (docs/runtime.md says what each does)."""
    return {"freezing": freezing, "max_autotune": gemm_backends != "ATEN",
            "max_autotune_gemm_backends": gemm_backends}


class CompiledTarget(Target):
    """`Target` on a static cache with compiled, batch-invariant scoring (see the module doc)."""

    runtime = "compiled"
    context_limit = "model.max_cache_len: raise it to fit longer sequences"

    def __init__(
        self,
        model,
        tokenizer=None,
        max_cache_len: int | None = None,
        buckets="auto",
        freezing: bool | str = "auto",
        gemm_backends: str = "CPP",
        fallback: bool = True,
        key_block: int = KEY_BLOCK,
        gemm: str = DEFAULT_GEMM,
        attention: str = DEFAULT_ATTENTION,
    ):
        options = {"max_cache_len": max_cache_len, "buckets": buckets, "freezing": freezing,
                   "gemm_backends": gemm_backends, "key_block": key_block, "gemm": gemm, "attention": attention}
        if gemm not in GEMMS:
            raise ConfigError(
                f"model.gemm={gemm!r} is not a GEMM of the compiled runtime; use one of: {', '.join(GEMMS)}.")
        dtype = str(model.dtype).removeprefix("torch.")
        if GEMMS[gemm] not in (None, dtype):  # it would run none of the model's linears: refused, not ignored
            raise ConfigError(f"model.gemm={gemm} computes in {GEMMS[gemm]}, but the model is {dtype}; set "
                              f"model.dtype={GEMMS[gemm]} or model.gemm=inductor.")
        if attention not in ATTENTIONS:
            raise ConfigError(f"model.attention={attention!r} is not an attention of the compiled runtime; use one "
                              f"of: {', '.join(ATTENTIONS)}.")
        stack = DecoderStack(model)  # refuses a model that is not laid out as the runtime needs
        quantized = any(isinstance(m, QuantLinear) for m in model.modules())
        if buckets == "auto":  # rows cost the quantized kernel each (no padding row); a float GEMM ~nothing
            buckets = (1,) if quantized else DEFAULT_BUCKETS
        # frozen weights are what inductor's C++ GEMM needs; a quantized model's linears run spec-zoo's kernel
        # either way, and unfrozen its graph is cached whole (AOTAutograd's cache refuses frozen graphs): a warm
        # process reaches its first token in about half the time, its steps as fast (docs/native.md)
        if freezing == "auto":
            freezing = not quantized
        if freezing not in (True, False):
            raise ConfigError(f"model.freezing={freezing!r}; use true, false or auto (frozen unless the linear "
                              "layers are quantized).")
        if isinstance(buckets, str) or not buckets or min(int(b) for b in buckets) < 1:
            raise ConfigError(f"model.buckets={buckets!r}; give row counts of at least 1, e.g. [2] or [1, 4], or "
                              "auto.")
        buckets = sorted({int(b) for b in buckets})
        limit = getattr(model.config, "max_position_embeddings", None) or max_cache_len or 2048
        max_cache_len = min(2048, limit) if max_cache_len is None else max_cache_len  # default: up to 2048
        if not 1 < max_cache_len <= limit:
            raise ConfigError(f"model.max_cache_len={max_cache_len}; it must be between 2 and the model's "
                              f"max_position_embeddings ({limit}).")
        window = getattr(model.config.get_text_config(), "sliding_window", None)
        if "sliding_attention" in stack.layer_types and window is not None and window < max_cache_len:
            raise ConfigError(f"model.runtime=compiled: {type(model).__name__} has sliding-window attention (window "
                              f"{window}) shorter than model.max_cache_len={max_cache_len}, and the compiled attention "
                              f"has no windows; set model.max_cache_len={window} or less, or model.runtime=eager.")
        self.options = options  # as given: what `graph_note` keys
        self.max_cache_len, self.buckets, self.fallback, self.key_block = max_cache_len, buckets, fallback, key_block
        self.settings = inductor_settings(freezing, gemm_backends)
        # the linear layers on spec-zoo's GEMM (its kernel built now, once per machine), or on inductor's
        self.gemm = gemm
        self.linears = {"skinny": SkinnyLinears, "amx": AmxLinears}.get(gemm, lambda: None)()
        if attention == "kernel":
            load_attention()  # built now, once per machine: a missing compiler fails before any model work
        self.attention = attention
        self._graphs: dict = {}  # compiled graphs by the states they hand out (`_graph`), each at its first use
        self.state_layers: tuple[int, ...] | None = None  # the states its drafter reads (`hand_out`)
        self.compile_s: float | None = None
        self.compile_cached = False  # whether the graph came from the on-disk cache
        self.entries = 1  # cache entries: one per sequence decoded at once (`hold`)
        self.store: Cache | None = None  # the static cache, every entry (allocated by `_fresh_cache`)
        super().__init__(model, tokenizer)
        self.max_length = max_cache_len
        stack.check()  # against the model's own forward, before any compiling
        self._stack = stack

    @property
    def cache_slots(self) -> int:
        """Slots the static cache holds: ``max_cache_len`` and one key block of slack, so the
        prefix span (rounded up past the sequence) stays shorter than the cache (a slice of
        all of it would be another, contiguous, case for the compiler)."""
        return self.max_cache_len + self.key_block

    def hold(self, sequences: int) -> None:
        """Make room for ``sequences`` sequences at once (one cache entry each), before any of them
        starts; more entries than the graph was compiled for recompile it (on first use)."""
        if sequences > self.entries:
            self.entries, self.store, self._graphs = sequences, None, {}
            self.reset()

    def _fresh_cache(self, slot: int = 0):
        if self.store is None:
            # a full static layer for every layer, sliding ones included (windows never cut: see __init__)
            head_dim = (getattr(self.config, "head_dim", None)
                        or self.config.hidden_size // self.config.num_attention_heads)
            self.store = static_store(len(self.layer_types), self.cache_slots, self.entries,
                                      self.config.num_key_value_heads, head_dim, self.dtype, self.device)
        if not 0 <= slot < self.entries:
            raise ValueError(f"cache entry {slot} of {self.entries}: call hold() first")
        return SlotCache(self.store, slot)

    def bucket(self, rows: int) -> int:
        """Rows actually run: padded up to the next bucket; past the last one, as they are."""
        return next((b for b in self.buckets if b >= rows), rows)

    # -- the forward --------------------------------------------------------------------------
    def _check_room(self, positions: int) -> None:
        if positions > self.max_cache_len:
            raise ConfigError(
                f"the sequence needs {positions} positions but the static cache holds model.max_cache_len="
                f"{self.max_cache_len}; raise model.max_cache_len (memory grows with it) or shorten the prompt."
            )

    def hand_out(self, layers: tuple[int, ...] | None) -> None:
        """Have scoring hand out the states entering ``layers`` side by side (an EAGLE-3 head's
        fused states) rather than the last layer's: the graph that does is the one `warm_up`
        compiles, and the one that serves scoring that asks no states."""
        self.state_layers = tuple(layers) if layers else None

    def _layers(self, hidden: bool | tuple[int, ...]) -> tuple[int, ...] | None:
        """The layers whose entering states a scoring that asks ``hidden`` runs the graph for (None:
        the last layer's, after the final norm)."""
        if isinstance(hidden, bool):
            return None if hidden else self.state_layers
        return tuple(hidden)

    def _forward(self, new: list[int], draft: Draft, past: int, hidden: bool | tuple[int, ...]):
        self._check_room(past + len(new) + len(draft))
        layers = self._layers(hidden)
        states, past, (tokens, rows, skip) = self._catch_up(new, past, layers), past + self._fed(new), \
            self._rows_after(new, draft)
        [(logits, tail)] = self._compiled_rows([(self.cache, tokens, rows, past)], layers)
        states.append(tail)
        return logits[skip:], torch.cat(states) if hidden else None

    def _fed(self, new: list[int]) -> int:
        """How many of the ``new`` committed tokens `_catch_up` caches before the graph call (the
        call's rows take the rest)."""
        return len(new) - 1 if len(new) - 1 > CATCH_UP else 0

    def _catch_up(self, new: list[int], past: int, layers: tuple[int, ...] | None) -> list[torch.Tensor]:
        """Cache many committed tokens before the last one (the prompt) in one eager forward into
        the static cache (eager GEMMs suit many rows): their states; a few (a draft model catching
        up) go through the graph call itself (`_rows_after`)."""
        if not self._fed(new):
            return []
        return [self._prefill(new[:-1], past, layers)]

    def _rows_after(self, new: list[int], draft: Draft) -> tuple[list[int], Draft, int]:
        """(the graph call's tokens, its draft, how many of its rows are committed tokens before the last
        one): the few committed tokens not cached yet ride in the call as a chain ahead of the draft,
        which hangs from the last of them, so a draft model catching up costs one call, not two."""
        ahead = new[self._fed(new):-1]
        if not ahead:
            return new[-1:] + draft.tokens.tolist(), draft, 0
        parents = list(range(-1, len(ahead) - 1)) + [p + len(ahead) if p >= 0 else len(ahead) - 1
                                                      for p in draft.parents]
        tokens = ahead[1:] + new[-1:] + draft.tokens.tolist()
        return ahead + new[-1:] + draft.tokens.tolist(), Draft(torch.tensor(tokens, dtype=torch.long), parents), \
            len(ahead)

    @torch.no_grad()
    def score_batch(self, batch, hidden: bool | tuple[int, ...] = False) -> list[Scores]:
        """`Target.score_batch` with every sequence's last committed token and draft in one graph
        call (their prompts and catch-up rows first, each on its own)."""
        if len(batch) == 1:  # alone: `score` (which may resume a partial forward)
            return super().score_batch(batch, hidden)
        groups, before, fed, layers = [], [], [], self._layers(hidden)
        for state, committed, draft in batch:
            if state is not None:
                self.use(state)
            if not committed:
                raise ValueError("score() needs at least one committed token (an empty prompt?)")
            new = committed[self.rewind(committed):]
            past = len(self.cached_tokens)
            self._check_room(past + len(new) + len(draft))
            states, past, (tokens, rows, skip) = self._catch_up(new, past, layers), past + self._fed(new), \
                self._rows_after(new, draft)
            groups.append((self.cache, tokens, rows, past))
            before.append(states)
            fed.append((len(new), skip))
            self._scored(committed, draft)
            self.forwards += 1
            if state is not None:
                state.update(self.sequence())
        results = []
        for (logits, tail), states, (m, skip) in zip(self._compiled_rows(groups, layers), before, fed):
            results.append(Scores(logits[skip:], torch.cat(states + [tail]) if hidden else None, m))
        return results

    def layer_mask(self, past: int, q: int) -> torch.Tensor:
        return slot_mask(past, q, past + q, self.dtype, self.device)  # over what `SlotLayer.update` returns

    def _prefill(self, tokens: list[int], past: int, layers: tuple[int, ...] | None) -> torch.Tensor:
        stack, q = self.stack, len(tokens)
        positions = torch.arange(past, past + q, device=self.device)[None]
        embeds, mask = stack.embed(torch.tensor([tokens], device=self.device)), self.layer_mask(past, q)
        return run_states(stack, embeds, layers, positions, self.cache, mask)[1][0]

    def _compiled_rows(self, groups: list, layers: tuple[int, ...] | None = None) -> list[tuple]:
        """(logits, states) of each group's rows, all in one graph call. A group is (its sequence's
        `SlotCache`, tokens, draft, past): its last committed token (row 0) then the draft's nodes,
        after ``past`` cached positions; each sequence's cache then holds ``past`` + its rows. The
        states are those entering ``layers`` side by side, or the last layer's (None)."""
        counts = [len(tokens) for _, tokens, _, _ in groups]
        sequences = [SequenceRows(cache.entry, past, [past, *(past + 1 + d for d in draft.depths)],
                                  [[], *([past + 1 + n for n in draft.path_to(node)] for node in range(len(draft)))],
                                  past + 1)  # the last committed token reads the prefix and itself, a node its path
                     for cache, _, draft, past in groups]
        rows = pack_rows(sequences, self.bucket(sum(counts)), self.key_block, self.dtype)
        ids = torch.zeros(rows.positions.shape, dtype=torch.long)
        for (_, tokens, _, _), first in zip(groups, rows.starts):
            ids[first: first + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logits, states = self._graph(layers)(*self._dynamic(ids, rows.positions, rows.mask, rows.slots,
                                                            rows.draft_mask, rows.row_cache, rows.write_at))
        out = []
        for (cache, _, _, past), count, first in zip(groups, counts, rows.starts):
            cache.set_length(past + count)
            out.append((logits[first: first + count], states[first: first + count]))
        return out

    def _dynamic(self, ids, positions, mask, slots, draft_mask, row_cache, write_at):
        """The graph's inputs, with the row count, the prefix span and the draft width marked
        dynamic: one compiled graph serves every shape (and one kernel family: a graph per
        row count would let inductor pick another GEMM for one row, whose rows differ in the
        last bits)."""
        to, top = self.device, self.cache_slots - 1
        rows_top = self.entries * self.cache_slots - 1  # a batch's rows: up to every entry's worth
        ids, positions, mask = ids[None].to(to), positions[None].to(to), mask.to(to)
        slots, draft_mask, row_cache, write_at = slots.to(to), draft_mask.to(to), row_cache.to(to), write_at.to(to)
        for tensor, dim in ((ids, 1), (positions, 1), (mask, 2), (slots, 0), (draft_mask, 0), (row_cache, 0),
                            (write_at, 0)):
            if self.buckets[0] == 1:  # a row count that may be 1: unbacked
                torch._dynamo.decorators.mark_unbacked(tensor, dim, min=1, max=rows_top)
            else:
                torch._dynamo.mark_dynamic(tensor, dim, min=2, max=rows_top)
        for tensor, dim in ((mask, 3), (slots, 1), (draft_mask, 1)):
            torch._dynamo.mark_dynamic(tensor, dim, min=2, max=top)
        return ids, positions, mask, slots, draft_mask, row_cache, write_at

    def _rows(self, ids, positions, mask, draft_slots, draft_mask, row_cache, write_at, layers=None):
        stack, store = self._stack, self.store
        assert store is not None  # allocated with the first sequence, before any forward
        out, states = run_states(stack, stack.embed(ids), layers, positions, PackedWrites(store), mask,
                                 draft_slots=draft_slots, draft_mask=draft_mask, row_cache=row_cache,
                                 write_at=write_at)
        return final_logits(self.model, out[0]), states[0]

    def _with_rowwise_attention(self, fn):
        return rowwise_run(fn, [self.config], self.settings, self.linears, self.attention)

    # -- compiling ----------------------------------------------------------------------------
    def _graph(self, layers: tuple[int, ...] | None = None):
        """The graph handing out the states entering ``layers`` (None: the last layer's)."""
        if layers not in self._graphs:
            self._graphs[layers] = self._compile(layers)
        return self._graphs[layers]

    def _compile(self, layers: tuple[int, ...] | None):
        """Compile the graph and run it once (a dummy step in the spare slots past every sequence's
        room, which nothing reads), so compile time is never counted as decoding time."""
        # distinct sizes, so dynamo gives each dimension its own symbol
        size, span, width = 2, min(2 * self.key_block, self.cache_slots - 1), 3 * DRAFT_BLOCK
        where = self.max_cache_len  # the key block of slack past max_cache_len
        inputs = self._dynamic(torch.zeros(size, dtype=torch.long), torch.full((size,), where),
                               torch.zeros(1, 1, size, span, dtype=self.dtype),
                               torch.zeros(size, width, dtype=torch.long), torch.zeros(size, width),
                               torch.zeros(size, dtype=torch.long), where + torch.arange(size))
        rows = functools.partial(self._rows, layers=layers) if layers else self._rows
        tag = fingerprint(self.model)
        graph, self.compile_s, self.compile_cached = compile_graph(
            rows, self._with_rowwise_attention, inputs, tag, "the target", "model", self.fallback,
            on_compiled=lambda seconds: self.graph_note(tag).write_text(json.dumps({"compile_s": seconds})))
        return graph

    def graph_note(self, tag: str | None = None) -> Path:
        """The note a compile of this target's graph leaves in inductor's cache (`graph_note`)."""
        return graph_note(self.model, self.options, tag)

    def warm_up(self) -> float:
        """Compile now, before anything is timed; the seconds it took."""
        self._graph(self.state_layers)
        assert self.compile_s is not None  # set by the compile
        return self.compile_s


def run_states(stack: DecoderStack, hidden: torch.Tensor, layers: tuple[int, ...] | None, positions, cache, mask,
               **attention) -> tuple[torch.Tensor, torch.Tensor]:
    """(the final norm's output [1, q, H], the states scoring hands out) after every layer of
    ``stack`` (`DecoderStack.run`'s arguments): the states entering ``layers`` side by side, as
    transformers' ``hidden_states`` numbers them (the last entry: the final norm's output), or
    the last layer's (None)."""
    taken, start = {}, 0
    for index in sorted(set(layers or ())):
        if index < stack.num_layers:
            hidden, start = stack.run(hidden, start, index, positions, cache, mask, **attention), index
            taken[index] = hidden
    out = stack.inner.norm(stack.run(hidden, start, stack.num_layers, positions, cache, mask, **attention))
    taken[stack.num_layers] = out
    return out, torch.cat([taken[index] for index in layers], dim=-1) if layers else out


def rowwise_run(fn, configs, settings: dict, linears=None, attention: str = "inductor"):
    """``fn`` run with the row-wise attention (set on the models' ``configs`` meanwhile; on the
    C++ kernel when ``attention`` is ``kernel``) and the inductor ``settings``; the models keep
    their own attention for eager calls, and inductor's config must be set where it compiles
    (``torch.compile(options=...)`` skips freezing)."""
    rowwise = "spec_zoo_rowwise_kernel" if attention == "kernel" else "spec_zoo_rowwise"

    def run(*args):
        before = [config._attn_implementation for config in configs]
        for config in configs:
            config._attn_implementation = rowwise
        try:
            # automatic dynamic shapes off: the dims `_dynamic` marks are the only dynamic ones, so a
            # graph does not depend on which other models this process compiled before (a dim seen
            # static elsewhere turned dynamic, other kernels, other bf16 logits for one of two graphs)
            with (inductor_config.patch(**settings), dynamo_config.patch(automatic_dynamic_shapes=False),
                  no_output_capture(), linears or nullcontext()):
                return fn(*args)
        finally:
            for config, implementation in zip(configs, before):
                config._attn_implementation = implementation

    return run


RECOMPILE_LIMIT = 256  # graphs of one compiled function per process (one per model, shape family or head)


def compile_graph(fn, under, inputs, tag: str, what: str, key: str, fallback: bool, on_compiled=None):
    """(graph, seconds, whether the on-disk cache served it): ``fn`` compiled (whole, one graph)
    and run once on ``inputs``, both ``under`` its settings (`rowwise_run`), through the FX graph
    cache keyed by ``tag`` (`spec_zoo.runtime.compile_cache`); then ``on_compiled(seconds)``. A compiler failure
    falls back to ``fn`` run eagerly with a warning naming ``key``'s runtime, or is raised without
    ``fallback``."""
    # every compiled target, head or module compiles the same Python function for its own weights,
    # and dynamo counts all those graphs against that one code object (8 by default): a process
    # that compiles more (a line-up of compiled heads, the test suite) would hit the limit and,
    # with fullgraph, fail over to eager decoding
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    graph = under(torch.compile(fn, fullgraph=True))
    print(f"spec-zoo: compiling {what} (minutes on a small CPU, faster when cached) ...", file=sys.stderr, flush=True)
    start, cached, compiled = time.perf_counter(), False, False
    try:
        with torch.no_grad(), cached_compile(tag) as cache:
            graph(*inputs)
        cached = cache["hit"]
        compiled = True
    except Exception as err:  # any compiler failure: fall back visibly or re-raise
        if not fallback:
            raise
        warnings.warn(f"{key}.runtime=compiled: compiling failed ({type(err).__name__}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}) for {what}; running eagerly. "
                      f"Set {key}.runtime=eager to silence this.", RuntimeWarning, stacklevel=3)
        graph = under(fn)
    seconds = time.perf_counter() - start
    print(f"spec-zoo: compiled {what} in {seconds:.1f} s{' (from the cache)' if cached else ''}",
          file=sys.stderr, flush=True)
    if compiled and on_compiled is not None:
        on_compiled(seconds)
    return graph, seconds, cached


def graph_note(model, options: dict, tag: str | None = None) -> Path:
    """Where compiling ``CompiledTarget(model, **options)`` leaves a note beside inductor's cache entries
    (``model.runtime=auto`` runs compiled when it is there): keyed by the weights (``tag``: their
    `fingerprint`, computed when not given), the options with the constructor's defaults, this torch and
    this CPU's vector ISA, so another machine's or another setting's compile is not taken for this one."""
    bound = inspect.signature(CompiledTarget).bind(None, **options)
    bound.apply_defaults()
    settings = {arg: value for arg, value in bound.arguments.items() if arg not in ("model", "tokenizer", "fallback")}
    host = torch.backends.cpu.get_cpu_capability()
    key = json.dumps([tag or fingerprint(model), settings, torch.__version__, host], sort_keys=True,
                     default=lambda value: list(value) if isinstance(value, Iterable) else str(value))
    folder = Path(inductor_cache_dir()) / "spec_zoo_graphs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.json"


@contextmanager
def no_output_capture():
    """An eager ``model(..., output_hidden_states=True)`` (EAGLE, Medusa) leaves transformers'
    output-capture hooks on the layers, and they read a ContextVar, which torch.compile cannot
    trace. Their collector has a compile mode that reads a plain attribute instead: set it
    (no collection) while the graph runs, then restore it."""
    collector = getattr(output_capturing, "_active_collector", None)
    if collector is None or not hasattr(collector, "compiling"):
        yield
        return
    saved = collector.compiling, collector.global_var
    collector.compiling, collector.global_var = True, None
    try:
        yield
    finally:
        collector.compiling, collector.global_var = saved


class SlotLayer:
    """One sequence's view of one layer of the shared static cache: its entry's keys and values
    ([1, Hkv, slots, D] views) and its own length. Crops move the length; eager forwards (a
    prompt, a partial forward) append after it."""

    is_initialized = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values, self.length = keys, values, 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens: int) -> None:
        """Drop the last ``-tokens`` positions (a static layer crops by a negative count)."""
        if tokens > 0:
            raise RuntimeError("a static cache layer crops by a negative count of tokens")
        self.length = max(0, self.length + tokens)

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs):
        """Append; return the sequence's keys and values so far, not the whole entry: an eager
        prompt of q tokens then attends over its own q + past slots, not all max_cache_len of them
        (which made a batch's prompts cost more than its decoding)."""
        q = keys.shape[-2]
        self.keys[..., self.length: self.length + q, :] = keys
        self.values[..., self.length: self.length + q, :] = values
        self.length += q
        return self.keys[..., : self.length, :], self.values[..., : self.length, :]


class SlotCache:
    """A sequence's cache on the compiled runtime: entry ``entry`` of the target's static cache,
    each layer with the sequence's own length (`SlotLayer`)."""

    def __init__(self, store: Cache, entry: int):
        self.entry = entry
        self.layers = [SlotLayer(layer.keys[entry: entry + 1], layer.values[entry: entry + 1])
                       for layer in store.layers]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(keys, values)

    @property
    def length(self) -> int:
        """Positions the sequence holds (every layer as many, outside a partial forward)."""
        return self.layers[0].length

    def set_length(self, length: int) -> None:
        for layer in self.layers:
            layer.length = length


class PackedWrites:
    """The cache the compiled graph writes through: row m's key and value go to slot ``write_at[m]``
    of entry ``row_cache[m]`` (both passed with the attention's arguments), and attention reads
    every entry, each row its own (`rowwise_attention`)."""

    def __init__(self, store: Cache):
        self.layers = store.layers

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, kwargs=None, **rest):
        layer, given = self.layers[layer_idx], kwargs if kwargs is not None else rest
        rows, at = given["row_cache"], given["write_at"]
        layer.keys[rows, :, at] = keys[0].transpose(0, 1)
        layer.values[rows, :, at] = values[0].transpose(0, 1)
        return layer.keys, layer.values


@dataclass
class SequenceRows:
    """One sequence's rows of a packed graph call: its cache entry and length (where its rows' KV
    goes, in order), each row's position and path of slots (its ancestors root first, then itself;
    empty for a row that reads the prefix only), and the prefix slots every row reads."""

    entry: int
    length: int
    positions: list[int]
    paths: list[list[int]]
    visible: int


@dataclass
class PackedRows:
    """The graph's row inputs for several sequences at once (`pack_rows`), and where each
    sequence's rows start."""

    positions: torch.Tensor  # [size]
    mask: torch.Tensor  # [1, 1, size, span]: the prefix slots each row reads
    slots: torch.Tensor  # [size, width]: each row's path of slots
    draft_mask: torch.Tensor  # [size, width]: 0 on the path, masked past it
    row_cache: torch.Tensor  # [size]: each row's cache entry
    write_at: torch.Tensor  # [size]: the slot each row's KV is written to
    starts: list[int]


def pack_rows(sequences: list[SequenceRows], size: int, key_block: int, dtype: torch.dtype) -> PackedRows:
    """The row inputs of one call of a compiled graph for ``sequences``' rows side by side, padded to
    ``size`` rows: the compiled target's (`CompiledTarget._compiled_rows`) and a compiled head's
    (`spec_zoo.runtime.compiled_head.CompiledHead.together`). Each row reads its sequence's first ``visible``
    slots, rounded up to ``key_block`` (and the same lanes for a slot whatever the length, so rows
    stay bit-identical as it grows), then its path; its KV goes to the slot after its sequence's
    length. Padding rows join the last sequence: its prefix, their KV past it (masked until
    overwritten). ``dtype``: the attention mask's."""
    masked = torch.finfo(dtype).min
    width = -(-max(1, *(len(path) for seq in sequences for path in seq.paths)) // DRAFT_BLOCK) * DRAFT_BLOCK
    span = max(max(1, -(-seq.visible // key_block)) * key_block for seq in sequences)
    mask = torch.full((1, 1, size, span), masked, dtype=dtype)
    slots = torch.zeros(size, width, dtype=torch.long)
    draft_mask = torch.full(slots.shape, masked, dtype=torch.float32)
    positions, row_cache, write_at = (torch.zeros(size, dtype=torch.long) for _ in range(3))
    rows, first, starts = sum(len(seq.paths) for seq in sequences), 0, []
    for seq in sequences:
        count = len(seq.paths)
        end = size if first + count == rows else first + count
        for row, path in enumerate(seq.paths):
            slots[first + row, : len(path)] = torch.tensor(path, dtype=torch.long)
            draft_mask[first + row, : len(path)] = 0.0
        mask[0, 0, first:end, : seq.visible] = 0.0
        positions[first:end] = seq.positions[-1]
        positions[first: first + count] = torch.tensor(seq.positions, dtype=torch.long)
        row_cache[first:end] = seq.entry
        write_at[first:end] = seq.length + torch.arange(end - first)
        starts.append(first)
        first += count
    return PackedRows(positions, mask, slots, draft_mask, row_cache, write_at, starts)


def static_store(layers: int, slots: int, entries: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device) -> Cache:
    """A static cache of ``layers`` layers, each [entries, heads, slots, head_dim], allocated now:
    compiled graphs hold its tensors' addresses, and its entry count is marked static, so a new
    count recompiles rather than becoming a symbol."""
    store = Cache(layers=[StaticLayer(max_cache_len=slots) for _ in range(layers)])
    store.early_initialization(entries, heads, head_dim, dtype, device)
    for layer in store.layers:
        torch._dynamo.mark_static(layer.keys)
        torch._dynamo.mark_static(layer.values)
    return store


def slot_mask(past: int, q: int, slots: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive [1, 1, q, slots] mask over every slot of a static cache for q positions fed
    eagerly after ``past``: causal over the sequence, the slots past it hidden."""
    mask = torch.full((1, 1, q, slots), torch.finfo(dtype).min, dtype=dtype)
    rows = causal_mask(past, q, dtype, "cpu")  # None for one row, which sees every past slot
    mask[..., : past + q] = 0.0 if rows is None else rows
    return mask.to(device)


def crop_all(cache, length: int) -> None:
    """Set every static layer's length to ``length`` (the KV beyond it is left to be overwritten)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)
