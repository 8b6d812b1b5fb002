"""`CompiledHead`: a one-layer draft head (EAGLE's) on a static KV cache, one compiled graph.

Eagerly, an EAGLE head's drafted token costs ~0.13 of a compiled target step for ~7 % of the
target's weight bytes: PyTorch's per-op overhead, not arithmetic. Compiled as the target is
(`spec_zoo.runtime.compiled`: frozen weights, inductor's C++ GEMM, the row-wise attention), the head's
``inputs`` (``fc``), decoder layer, ``feature`` and draft-vocabulary logits are one graph whose
row count, attention span and path width are dynamic: one compile per process serves the
step's catch-up rows, every chain token and every tree level, and later processes read it
from inductor's on-disk cache (`spec_zoo.runtime.compile_cache`).

Rows are described as the target's compiled rows are: each reads the first ``visible`` cache
slots (the positions already fed) and its own path of slots, its ancestors root first and
then itself (a chain's rows read the rows before them; a tree node its ancestors), so a row's
arithmetic is the same whether it runs alone or beside others. Its KV goes to the slot after
the cache's length, where its path says it is. More rows than ``CHUNK`` at once (the prompt)
run as consecutive chunks of the same graph.

A batch of sequences drafts together: the static cache has one entry per sequence (`hold`),
each sequence sees its entry through its own view (`sequence`, a `spec_zoo.runtime.compiled.SlotCache`
with its own length), and `together` runs several sequences' rows in one graph call, each row
naming its entry, as the target's packed rows do. One sequence is a call of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from spec_zoo.errors import ConfigError
from spec_zoo.runtime.attention_kernel import DEFAULT_ATTENTION
from spec_zoo.runtime.attention_kernel import load as load_attention
from spec_zoo.runtime.compile_cache import fingerprint
from spec_zoo.runtime.compiled import (
    DRAFT_BLOCK,
    KEY_BLOCK,
    PackedWrites,
    SequenceRows,
    SlotCache,
    compile_graph,
    inductor_settings,
    pack_rows,
    rowwise_run,
    static_store,
)

CHUNK = 64  # rows per graph call at most: a path is at most this wide, so catching up on a prompt stays cheap
TREE_ROOM = 256  # cache slots past ``max_cache_len`` for the nodes of a drafted tree


class CompiledHead:
    """``head`` (`spec_zoo.draft_head.BlockHead` or a published EAGLE head: ``inputs``,
    ``forward``, ``feature``, ``logits``) with ``rotary`` (hidden, positions -> cos/sin) on a
    static cache of ``max_cache_len`` positions per sequence, run by one compiled graph (module doc).

    widths:  (token embedding, feature) widths of the rows fed.
    weights: modules the graph reads besides the head (the target's rotary embedding), so the
             on-disk cache tells heads apart by every weight they compile in.
    key:     the config key named in errors and in the eager fallback's warning.
    attention: ``kernel`` (spec-zoo's C++ attention, float32) or ``inductor``; the EAGLE drafter passes its
               compiled target's ``model.attention``.
    cache_layers: static cache layers (one per decoder layer the head runs: 1 for EAGLE's, E + 1 for an
               early-exit draft, `spec_zoo.drafters.early_exit.compiled`).
    """

    runtime = "compiled"

    def __init__(self, head, rotary, widths: tuple[int, int], weights: tuple[torch.nn.Module, ...] = (),
                 max_cache_len: int = 2048, key_block: int = KEY_BLOCK, freezing: bool = True,
                 gemm_backends: str = "CPP", fallback: bool = True, key: str = "drafter",
                 attention: str = DEFAULT_ATTENTION, cache_layers: int = 1):
        self.head, self.rotary, self.widths, self.weights, self.key = head, rotary, widths, weights, key
        if attention == "kernel":
            load_attention()  # built now, once per machine (the target's runtime usually built it already)
        self.attention = attention
        self.max_cache_len, self.key_block, self.fallback = max_cache_len, key_block, fallback
        self.settings = inductor_settings(freezing, gemm_backends)
        attentions = [m for m in head.modules() if hasattr(m, "layer_idx") and hasattr(m, "head_dim")]  # attention
        # where the row-wise attention is set while the graph runs (a copied layer has its own config)
        self.configs = list({id(m.config): m.config for m in attentions}.values())
        layer = attentions[0]
        self.dtype, self.device = next(layer.parameters()).dtype, next(layer.parameters()).device
        self.kv_shape = (layer.config.num_key_value_heads, layer.head_dim)
        self.cache_layers = cache_layers
        self.entries = 1  # cache entries: one per sequence drafted at once (`hold`)
        self.store: Cache | None = None  # every entry's KV (allocated before compiling: the graph holds its address)
        self._compiled = None
        self.compile_s: float | None = None
        self.compile_cached = False

    @property
    def cache_slots(self) -> int:
        """``max_cache_len``, room for a tree's nodes, and a key block of slack (as the target's)."""
        return self.max_cache_len + TREE_ROOM + self.key_block

    def hold(self, sequences: int) -> None:
        """Make room for ``sequences`` sequences drafting at once (one cache entry each), before any
        of them starts; more entries than the graph was compiled for recompile it (on first use)."""
        if sequences > self.entries:
            self.entries, self.store, self._compiled = sequences, None, None

    def _store(self) -> Cache:
        if self.store is None:
            self.store = static_store(self.cache_layers, self.cache_slots, self.entries, *self.kv_shape, self.dtype,
                                      self.device)
        return self.store

    def sequence(self, slot: int = 0) -> SlotCache:
        """A new, empty sequence in cache entry ``slot``: its view of the cache, with its own length
        (what drafters crop with `spec_zoo.runtime.target.follow`, and hand to `causal`, `rows` and `together`)."""
        if not 0 <= slot < self.entries:
            raise ValueError(f"cache entry {slot} of {self.entries}: call hold() first")
        return SlotCache(self._store(), slot)

    def causal(self, cache: SlotCache, embeds: torch.Tensor, features: torch.Tensor, pick: list[int]):
        """`rows` for m tokens fed in order after the cache's length (each reads those before
        it), in chunks of at most ``CHUNK`` rows; ``pick`` indexes the last chunk's rows."""
        for call in self.causal_rows(cache, embeds, features, pick):
            out = self.together([call])[0]
        return out

    def causal_rows(self, cache: SlotCache, embeds: torch.Tensor, features: torch.Tensor,
                    pick: list[int]) -> list[HeadRows]:
        """`causal`'s calls, to be run in order (each chunk reads the ones before it)."""
        m, past = embeds.shape[1], cache.length
        calls = []
        for start in range(0, m, CHUNK):
            stop, at = min(m, start + CHUNK), past + start
            paths = [list(range(at, at + j + 1)) for j in range(stop - start)]
            calls.append(HeadRows(self, cache, embeds[:, start:stop], features[:, start:stop],
                                  list(range(at, past + stop)), paths, at, pick if stop == m else [0]))
        return calls

    def rows(self, cache: SlotCache, embeds: torch.Tensor, features: torch.Tensor, positions: list[int],
             paths: list[list[int]], visible: int, pick: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the head's feature guesses [m, H], draft-vocabulary logits [len(pick), V_draft] of the
        rows ``pick``) for m rows of token embeddings and the features before them ([1, m, .]
        each) at ``positions``, fed to ``cache``; row i reads the first ``visible`` slots and
        ``paths[i]`` (its own slot, ``length + i``, last), where its KV is written."""
        return self.together([HeadRows(self, cache, embeds, features, positions, paths, visible, pick)])[0]

    @torch.no_grad()
    def together(self, calls: list[HeadRows]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`rows` of several sequences (each its own cache entry) in one graph call: a row's
        arithmetic depends on neither the rows beside it nor their entries, so each sequence gets
        what it gets alone."""
        counts = [len(call.paths) for call in calls]
        rows = sum(counts)
        size = max(2, rows)  # a dynamic dimension cannot be 1
        for call, count in zip(calls, counts):
            if call.cache.length + count + (size - rows) > self.max_cache_len + TREE_ROOM:
                raise ConfigError(f"the draft head's static cache holds {self.max_cache_len} positions (+ a tree) "
                                  f"and the sequence needs more: raise model.max_cache_len, or set "
                                  f"{self.key}.runtime=eager.")
        packed = pack_rows([SequenceRows(call.cache.entry, call.cache.length, call.positions, call.paths, call.visible)
                            for call in calls], size, self.key_block, torch.float32)
        x = torch.zeros(1, size, self.widths[0], dtype=self.dtype)
        f = torch.zeros(1, size, self.widths[1], dtype=self.dtype)
        picked = []
        for call, count, first in zip(calls, counts, packed.starts):
            x[0, first: first + count], f[0, first: first + count] = call.embeds[0], call.features[0]
            picked += [first + p % count for p in call.pick]
        pick = torch.tensor(picked * (2 if len(picked) == 1 else 1), dtype=torch.long)
        feature, logits = self._graph()(*self._dynamic(x, f, packed.positions[None], packed.mask, packed.slots,
                                                       packed.draft_mask, pick, packed.row_cache, packed.write_at))
        out, at = [], 0
        for call, count, first in zip(calls, counts, packed.starts):
            call.cache.set_length(call.cache.length + count)  # padding rows' KV lies past it, masked until overwritten
            out.append((feature[first: first + count], logits[at: at + len(call.pick)]))
            at += len(call.pick)
        return out

    def _dynamic(self, *inputs):
        """The graph's inputs with every size that varies marked dynamic (one graph serves all)."""
        x, f, positions, mask, slots, draft_mask, pick, row_cache, write_at = inputs
        rows_top = self.entries * self.cache_slots - 1
        for tensor, dim, most in ((x, 1, rows_top), (f, 1, rows_top), (positions, 1, rows_top), (mask, 2, rows_top),
                                  (mask, 3, self.cache_slots - 1), (slots, 0, rows_top),
                                  (slots, 1, self.cache_slots - 1), (draft_mask, 0, rows_top),
                                  (draft_mask, 1, self.cache_slots - 1), (pick, 0, rows_top),
                                  (row_cache, 0, rows_top), (write_at, 0, rows_top)):
            torch._dynamo.mark_dynamic(tensor, dim, min=2, max=most)
        return inputs

    def _forward(self, embeds, features, positions, mask, slots, draft_mask, pick, row_cache, write_at):
        head = self.head
        hidden = head.inputs(embeds, features)
        out = head(hidden, self.rotary(hidden, positions), PackedWrites(self._store()), mask, draft_slots=slots,
                   draft_mask=draft_mask, row_cache=row_cache, write_at=write_at)[0]
        return head.feature(out), head.logits(out[pick])

    def _graph(self):
        if self._compiled is None:
            self._compiled = self._compile()
        return self._compiled

    def _compile(self):
        """Compile and run once on two rows in the spare slots past every sequence's room (which
        nothing reads), each dimension a distinct size so dynamo gives each its own symbol."""
        (embed, feature), block, where = self.widths, DRAFT_BLOCK, self.max_cache_len + TREE_ROOM
        inputs = self._dynamic(torch.zeros(1, 2, embed, dtype=self.dtype), torch.zeros(1, 2, feature, dtype=self.dtype),
                               torch.full((1, 2), where), torch.zeros(1, 1, 2, 2 * self.key_block),
                               torch.full((2, 3 * block), where, dtype=torch.long), torch.zeros(2, 3 * block),
                               torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                               where + torch.arange(2))
        tag = fingerprint(torch.nn.ModuleList([self.head, *self.weights]))
        self._store()  # allocated before tracing: the graph reads it

        def under(fn):
            return rowwise_run(fn, self.configs, self.settings, attention=self.attention)

        graph, self.compile_s, self.compile_cached = compile_graph(
            self._forward, under, inputs, tag, "the draft head", self.key, self.fallback)
        return graph

    def warm_up(self) -> float:
        """Compile now, before anything is timed; the seconds it took."""
        self._graph()
        assert self.compile_s is not None  # set by the compile
        return self.compile_s


@dataclass
class HeadRows:
    """One sequence's rows of a head call (`CompiledHead.rows`), as a drafter asks for them
    (`spec_zoo.lockstep`): the head that answers it, the sequence's cache, token embeddings and
    features [1, m, .], positions, paths of slots, the slots every row reads, and the rows whose
    logits are wanted."""

    server: CompiledHead
    cache: SlotCache
    embeds: torch.Tensor
    features: torch.Tensor
    positions: list[int]
    paths: list[list[int]]
    visible: int
    pick: list[int]
