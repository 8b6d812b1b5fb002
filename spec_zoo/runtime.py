"""The compiled runtime: a static KV cache and one inductor graph for every scored-token count.

On a CPU, eager PyTorch makes scoring 2-3 tokens cost 1.7-2x one token (MKL switches
kernels), which eats what speculation saves. Inductor's C++ micro-GEMM reads the weights
once per block of rows, so a few scored tokens cost about what one does, and each row's
arithmetic does not depend on how many rows were scored with it (batch invariance): a
speculative run then equals plain decoding on this runtime bit for bit. This is
gpt-fast's recipe (static cache + ``torch.compile``) on the model's own modules.

`CompiledTarget` keeps `Target`'s contract and changes only how a forward runs:

- The cache is a transformers `StaticCache` of ``max_cache_len`` positions. Cropping moves
  its length; committing a tree path gathers the accepted rows into place (`Target.commit`).
- The last committed token and the draft nodes (M rows) go through one compiled graph whose
  row count and attention span are dynamic dimensions: one compile serves every M, with the
  same kernels (a graph per M let inductor pick another GEMM for one row). A single row runs
  padded to 2 (``buckets``); padding rows attend to the cache only and their KV lands past
  the sequence, where the mask hides it until it is overwritten.
- Attention (`rowwise_attention`) reads the slots in use, rounded up to ``key_block``, each
  row in its own order, so a row's arithmetic depends neither on M nor on the tree around it.
- Committed tokens before the last one (the prompt) are prefilled eagerly into the same
  cache: one long forward that runs once per prompt and would cost a compile per length.
  Plain and speculative decoding prefill alike, so they still match bit for bit.

The graph compiles once per process (frozen weights keep inductor's on-disk FX cache from
serving another process); `warm_up` compiles ahead of time and says how long it took.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from contextlib import contextmanager

import torch
from torch._inductor import config as inductor_config
from transformers import AttentionInterface, StaticCache
from transformers.utils import output_capturing

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.layers import DecoderStack, causal_mask
from spec_zoo.target import Target

KEY_BLOCK = 64  # attention spans a multiple of this many cache slots (a multiple of every SIMD width)
DEFAULT_BUCKETS = (2,)  # a single row runs as 2: the row count is a dynamic dimension, which cannot be 1


def rowwise_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, key_order=None, **kwargs):
    """Attention whose every output row is computed on its own, as fused multiply-and-sum
    reductions over the key axis: inductor generates the same loop for a row whatever the
    number of rows, which the CPU SDPA kernel (another blocking per query length) does not.

    ``key_order`` [M, L] (slot indices) makes a row read the cache in its own order: a tree
    node reads its ancestors right after the committed prefix, where its path scored as a
    chain (or plain decoding) has them, so it is summed in the same order, bit for bit.
    query [B, H, M, D]; key, value [B, Hkv, L, D]; attention_mask additive [B, 1, M, L]
    (in ``key_order``'s order)."""
    b, heads, m, d = query.shape
    groups = heads // key.shape[1]
    q = query.reshape(b, key.shape[1], groups, m, 1, d)
    if key_order is None:
        key, value = key[:, :, None, None], value[:, :, None, None]
    else:  # [B, Hkv, 1, M, L, D]: the first L slots, each row in its order (fused into the reductions)
        key, value = key[:, :, key_order].unsqueeze(2), value[:, :, key_order].unsqueeze(2)
    scores = (q * key).sum(-1) * scaling + attention_mask[:, :, None]  # [B, Hkv, G, M, L]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (weights.unsqueeze(-1) * value).sum(-2)  # [B, Hkv, G, M, D]
    return out.reshape(b, heads, m, d).transpose(1, 2), None


AttentionInterface.register("spec_zoo_rowwise", rowwise_attention)


def use_spec_zoo_inductor_cache() -> None:
    """Point inductor's on-disk caches (autotuning results, compiled kernels) under the
    spec-zoo cache dir, unless the user chose a dir."""
    from spec_zoo.models import cache_root

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


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
        buckets=DEFAULT_BUCKETS,
        freezing: bool = True,
        gemm_backends: str = "CPP",
        fallback: bool = True,
        key_block: int = KEY_BLOCK,
    ):
        buckets = sorted({int(b) for b in buckets})
        if not buckets or buckets[0] < 2:
            raise ConfigError(f"model.buckets={list(buckets)}; give row counts of at least 2 (a dynamic graph "
                              "dimension cannot be 1), e.g. [2] or [2, 4].")
        limit = getattr(model.config, "max_position_embeddings", None) or max_cache_len or 2048
        max_cache_len = min(2048, limit) if max_cache_len is None else max_cache_len  # default: up to 2048
        if not 1 < max_cache_len <= limit:
            raise ConfigError(f"model.max_cache_len={max_cache_len}; it must be between 2 and the model's "
                              f"max_position_embeddings ({limit}).")
        self.max_cache_len, self.buckets, self.fallback, self.key_block = max_cache_len, buckets, fallback, key_block
        self.settings = inductor_settings(freezing, gemm_backends)
        self._compiled = None  # the graph, compiled at the first compiled forward
        self.compile_s: float | None = None
        super().__init__(model, tokenizer)
        self.max_length = max_cache_len
        self._stack = DecoderStack(model)

    def _fresh_cache(self):
        if getattr(self, "cache", None) is None:
            cache = StaticCache(config=self.config, max_cache_len=self.max_cache_len)
            heads = self.config.num_key_value_heads
            head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
            cache.early_initialization(1, heads, head_dim, self.dtype, self.device)  # allocated before compiling
            return cache
        crop_all(self.cache, 0)  # keep the tensors: compiled graphs hold their addresses
        return self.cache

    def bucket(self, rows: int) -> int:
        """Rows actually run: padded up to the next bucket; past the last one, as they are."""
        return next((b for b in self.buckets if b >= rows), rows)

    # -- the forward --------------------------------------------------------------------------
    def _forward(self, new: list[int], draft: Draft, past: int, hidden: bool):
        m, n = len(new), len(draft)
        if past + m + n > self.max_cache_len:
            raise ConfigError(
                f"the sequence needs {past + m + n} positions but the static cache holds model.max_cache_len="
                f"{self.max_cache_len}; raise model.max_cache_len (memory grows with it) or shorten the prompt."
            )
        states = []
        if m > 1:  # the prompt (or any run of committed tokens): one eager forward into the static cache
            states.append(self._prefill(new[:-1], past))
            past, new = past + m - 1, new[-1:]
        logits, tail = self._compiled_rows(new + draft.tokens.tolist(), draft, past)
        states.append(tail)
        return logits, torch.cat(states) if hidden else None

    def causal_mask(self, past: int, q: int) -> torch.Tensor:
        """Over every slot of the static cache: the positions past the sequence are hidden."""
        mask = torch.full((1, 1, q, self.max_cache_len), torch.finfo(self.dtype).min, dtype=self.dtype)
        mask[..., : past + q] = causal_mask(past, q, self.dtype, "cpu") if q > 1 else 0.0
        return mask.to(self.device)

    def _prefill(self, tokens: list[int], past: int) -> torch.Tensor:
        stack, q = self._stack, len(tokens)
        positions = torch.arange(past, past + q, device=self.device)[None]
        out = stack.run(stack.embed(torch.tensor([tokens], device=self.device)), 0, stack.num_layers,
                        positions, self.cache, self.causal_mask(past, q))
        return stack.inner.norm(out[0])

    def _compiled_rows(self, tokens: list[int], draft: Draft, past: int):
        """Logits and states of the last committed token (row 0) and the draft nodes."""
        rows = len(tokens)
        size = self.bucket(rows)
        # attention reads the first `slots` cache slots only, a multiple of key_block, and the
        # same lanes for a slot whatever the length, so rows stay bit-identical as it grows
        slots = min(self.max_cache_len, -(-(past + size) // self.key_block) * self.key_block)
        # each row reads the cache in its own order (see rowwise_attention): the prefix, then
        # its path's nodes root first; it sees the prefix, the committed token and its path
        order = torch.arange(slots).repeat(size, 1)
        seen = torch.full((size,), past + 1)
        for node, depth in enumerate(draft.depths):
            path = torch.tensor(draft.path_to(node))
            order[1 + node, past + 1 : past + 2 + depth] = past + 1 + path
            seen[1 + node] = past + 2 + depth
        allowed = torch.arange(slots)[None] < seen[:, None]
        positions = torch.full((size,), past, dtype=torch.long)
        positions[1:rows] = past + 1 + torch.tensor(draft.depths, dtype=torch.long)
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        ids = torch.zeros(size, dtype=torch.long)
        ids[:rows] = torch.tensor(tokens, dtype=torch.long)
        crop_all(self.cache, past)  # the graph appends at every layer's length
        logits, states = self._graph()(*self._dynamic(ids, positions, mask, order))
        crop_all(self.cache, past + rows)  # padding rows' KV lies past the sequence, masked until overwritten
        return logits[:rows], states[:rows]

    def _dynamic(self, ids, positions, mask, order):
        """The graph's inputs, with the row count and the attention span marked dynamic: one
        compiled graph serves every shape (and one kernel family: a graph per row count would
        let inductor pick another GEMM for one row, whose rows differ in the last bits)."""
        to, top = self.device, self.max_cache_len
        ids, positions, mask, order = ids[None].to(to), positions[None].to(to), mask[None, None].to(to), order.to(to)
        for tensor, row_dim in ((ids, 1), (positions, 1), (mask, 2), (order, 0)):
            torch._dynamo.mark_dynamic(tensor, row_dim, min=2, max=top)
        torch._dynamo.mark_dynamic(mask, 3, min=2, max=top)
        torch._dynamo.mark_dynamic(order, 1, min=2, max=top)
        return ids, positions, mask, order

    def _rows(self, ids, positions, mask, key_order):
        stack = self._stack
        hidden = stack.run(stack.embed(ids), 0, stack.num_layers, positions, self.cache, mask, key_order=key_order)
        out = stack.inner.norm(hidden)[0]
        return self.model.lm_head(out), out

    def _with_rowwise_attention(self, fn):
        """``fn`` run with the row-wise attention and the inductor settings; the model keeps its
        own attention for eager calls, and inductor's config must be set where it compiles
        (``torch.compile(options=...)`` skips freezing)."""

        def run(*args):
            config, before = self.config, self.config._attn_implementation
            config._attn_implementation = "spec_zoo_rowwise"
            try:
                with inductor_config.patch(**self.settings), no_output_capture():
                    return fn(*args)
            finally:
                config._attn_implementation = before

        return run

    # -- compiling ----------------------------------------------------------------------------
    def _graph(self):
        if self._compiled is None:
            self._compiled = self._compile()
        return self._compiled

    def _compile(self):
        """Compile the graph and run it once (a dummy step past the sequence, then undone), so
        compile time is never counted as decoding time."""
        use_spec_zoo_inductor_cache()
        graph = self._with_rowwise_attention(torch.compile(self._rows, fullgraph=True))
        length = int(self.cache.layers[0].get_seq_length())
        size, slots = 2, min(self.max_cache_len, 2 * self.key_block)
        where = min(length, self.max_cache_len - size)
        inputs = self._dynamic(torch.zeros(size, dtype=torch.long), torch.full((size,), where),
                               torch.zeros(size, slots, dtype=self.dtype), torch.arange(slots).repeat(size, 1))
        print("spec-zoo: compiling the target (once per process; minutes on a small CPU) ...",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            crop_all(self.cache, where)
            with torch.no_grad():
                graph(*inputs)
        except Exception as err:  # noqa: BLE001 (any compiler failure: fall back visibly or re-raise)
            if not self.fallback:
                raise
            warnings.warn(f"model.runtime=compiled: compiling failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); running eagerly. "
                          "Set model.runtime=eager to silence this.", RuntimeWarning, stacklevel=2)
            graph = self._with_rowwise_attention(self._rows)
        finally:
            crop_all(self.cache, length)
        self.compile_s = time.perf_counter() - start
        print(f"spec-zoo: compiled in {self.compile_s:.1f} s", file=sys.stderr, flush=True)
        return graph

    def warm_up(self) -> float:
        """Compile now, before anything is timed; the seconds it took."""
        self._graph()
        return self.compile_s


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


def crop_all(cache, length: int) -> None:
    """Set every static layer's length to ``length`` (the KV beyond it is left to be overwritten)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)
