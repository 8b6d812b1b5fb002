"""`CompiledHead`: a one-layer draft head (EAGLE's) on a static KV cache, one compiled graph.

Eagerly, an EAGLE head's drafted token costs ~0.13 of a compiled target step for ~7 % of the
target's weight bytes: PyTorch's per-op overhead, not arithmetic. Compiled as the target is
(`spec_zoo.runtime`: frozen weights, inductor's C++ GEMM, the row-wise attention), the head's
``inputs`` (``fc``), decoder layer, ``feature`` and draft-vocabulary logits are one graph whose
row count, attention span and path width are dynamic: one compile per process serves the
step's catch-up rows, every chain token and every tree level, and later processes read it
from inductor's on-disk cache (`spec_zoo.compile_cache`).

Rows are described as the target's compiled rows are: each reads the first ``visible`` cache
slots (the positions already fed) and its own path of slots, its ancestors root first and
then itself (a chain's rows read the rows before them; a tree node its ancestors), so a row's
arithmetic is the same whether it runs alone or beside others. Its KV goes to the slot after
the cache's length, where its path says it is. More rows than ``CHUNK`` at once (the prompt)
run as consecutive chunks of the same graph.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from spec_zoo.attention_kernel import DEFAULT_ATTENTION
from spec_zoo.attention_kernel import load as load_attention
from spec_zoo.compile_cache import fingerprint
from spec_zoo.errors import ConfigError
from spec_zoo.runtime import DRAFT_BLOCK, KEY_BLOCK, compile_graph, crop_all, inductor_settings, rowwise_run

CHUNK = 64  # rows per graph call at most: a path is at most this wide, so catching up on a prompt stays cheap
TREE_ROOM = 256  # cache slots past ``max_cache_len`` for the nodes of a drafted tree


class CompiledHead:
    """``head`` (`spec_zoo.draft_head.BlockHead` or a published EAGLE head: ``inputs``,
    ``forward``, ``feature``, ``logits``) with ``rotary`` (hidden, positions -> cos/sin) on a
    static one-layer cache of ``max_cache_len`` positions, run by one compiled graph (module doc).

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
        self.dtype = next(layer.parameters()).dtype
        self.cache = Cache(layers=[StaticLayer(max_cache_len=self.cache_slots) for _ in range(cache_layers)])
        self.cache.early_initialization(1, layer.config.num_key_value_heads, layer.head_dim, self.dtype,
                                        next(layer.parameters()).device)  # allocated before compiling
        self._compiled = None
        self.compile_s: float | None = None
        self.compile_cached = False
        self._held: dict | None = None  # the sequence whose KV the static cache holds (`use`)

    @property
    def cache_slots(self) -> int:
        """``max_cache_len``, room for a tree's nodes, and a key block of slack (as the target's)."""
        return self.max_cache_len + TREE_ROOM + self.key_block

    @property
    def length(self) -> int:
        """Slots in use: the positions fed and the nodes of the tree being drafted."""
        return int(self.cache.layers[0].cumulative_length)

    def reset(self) -> None:
        """Forget the sequence (the tensors stay: the graph holds their addresses)."""
        crop_all(self.cache, 0)

    @staticmethod
    def sequence() -> dict:
        """A new, empty sequence to `use`: drafters of a batch share the head, its graph and its
        one static cache, into which each sequence's KV is moved while it drafts."""
        return {"kv": [], "length": 0}

    def use(self, sequence: dict) -> None:
        """Make the static cache hold ``sequence``: the KV of the one held before is copied out to
        its own state and this one's copied in (its fed positions only; nothing moves when it is
        held already, as a sequence decoded alone always is)."""
        if self._held is sequence:
            return
        held, n = self._held, self.length
        if held is not None:
            held["kv"] = [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone())
                          for layer in self.cache.layers]
            held["length"] = n
        for layer, (keys, values) in zip(self.cache.layers, sequence["kv"]):
            layer.keys[:, :, : keys.shape[2]].copy_(keys)
            layer.values[:, :, : values.shape[2]].copy_(values)
        crop_all(self.cache, sequence["length"])
        self._held = sequence

    def causal(self, embeds: torch.Tensor, features: torch.Tensor, pick: list[int]):
        """`rows` for m tokens fed in order after the cache's length (each reads those before
        it), in chunks of at most ``CHUNK`` rows; ``pick`` indexes the last chunk's rows."""
        m, past = embeds.shape[1], self.length
        for start in range(0, m, CHUNK):
            stop, at = min(m, start + CHUNK), past + start
            out = self.rows(embeds[:, start:stop], features[:, start:stop], list(range(at, past + stop)),
                            [list(range(at, at + j + 1)) for j in range(stop - start)], at,
                            pick if stop == m else [0])
        return out

    def rows(self, embeds: torch.Tensor, features: torch.Tensor, positions: list[int], paths: list[list[int]],
             visible: int, pick: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the head's feature guesses [m, H], draft-vocabulary logits [len(pick), V_draft] of the
        rows ``pick``) for m rows of token embeddings and the features before them ([1, m, .]
        each) at ``positions``; row i reads the first ``visible`` slots and ``paths[i]`` (its
        own slot, ``length + i``, last), where its KV is written."""
        rows, length = len(paths), self.length
        size, masked = max(2, rows), torch.finfo(torch.float32).min  # a dynamic dimension cannot be 1
        if length + size > self.max_cache_len + TREE_ROOM:
            raise ConfigError(f"the draft head's static cache holds {self.max_cache_len} positions (+ a tree) and "
                              f"the sequence needs more: raise model.max_cache_len, or set {self.key}.runtime=eager.")
        width = max(len(path) for path in paths)
        slots = torch.zeros(size, -(-width // DRAFT_BLOCK) * DRAFT_BLOCK, dtype=torch.long)
        draft_mask = torch.full(slots.shape, masked)
        for row, path in enumerate(paths):
            slots[row, : len(path)] = torch.tensor(path)
            draft_mask[row, : len(path)] = 0.0
        span = max(1, -(-visible // self.key_block)) * self.key_block
        mask = torch.zeros(1, 1, 1, span)
        mask[..., visible:] = masked
        x = torch.zeros(1, size, embeds.shape[-1], dtype=self.dtype)
        f = torch.zeros(1, size, features.shape[-1], dtype=self.dtype)
        x[:, :rows], f[:, :rows] = embeds, features
        where = torch.full((1, size), positions[-1], dtype=torch.long)
        where[0, :rows] = torch.tensor(positions)
        picked = torch.tensor([p % rows for p in pick] * (2 if len(pick) == 1 else 1), dtype=torch.long)
        feature, logits = self._graph()(*self._dynamic(x, f, where, mask, slots, draft_mask, picked))
        crop_all(self.cache, length + rows)  # padding rows' KV lies past the sequence, masked until overwritten
        return feature[:rows], logits[: len(pick)]

    def _dynamic(self, *inputs):
        """The graph's inputs with every size that varies marked dynamic (one graph serves all)."""
        x, f, positions, mask, slots, draft_mask, pick = inputs
        for tensor, dim in ((x, 1), (f, 1), (positions, 1), (mask, 3), (slots, 0), (slots, 1), (draft_mask, 0),
                            (draft_mask, 1), (pick, 0)):
            torch._dynamo.mark_dynamic(tensor, dim, min=2, max=self.cache_slots - 1)
        return inputs

    def _forward(self, embeds, features, positions, mask, slots, draft_mask, pick):
        head = self.head
        hidden = head.inputs(embeds, features)
        out = head(hidden, self.rotary(hidden, positions), self.cache, mask, draft_slots=slots,
                   draft_mask=draft_mask)[0]
        return head.feature(out), head.logits(out[pick])

    def _graph(self):
        if self._compiled is None:
            self._compiled = self._compile()
        return self._compiled

    def _compile(self):
        """Compile and run once on two rows past the sequence (then undone), each dimension
        a distinct size so dynamo gives each its own symbol."""
        length = self.length
        (embed, feature), block = self.widths, DRAFT_BLOCK
        inputs = self._dynamic(torch.zeros(1, 2, embed, dtype=self.dtype), torch.zeros(1, 2, feature, dtype=self.dtype),
                               torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 1, 1, 2 * self.key_block),
                               torch.full((2, 3 * block), length, dtype=torch.long), torch.zeros(2, 3 * block),
                               torch.zeros(3, dtype=torch.long))
        tag = fingerprint(torch.nn.ModuleList([self.head, *self.weights]))

        def under(fn):
            return rowwise_run(fn, self.configs, self.settings, attention=self.attention)

        try:
            graph, self.compile_s, self.compile_cached = compile_graph(
                self._forward, under, inputs, tag, "the draft head", self.key, self.fallback)
        finally:
            crop_all(self.cache, length)
        return graph

    def warm_up(self) -> float:
        """Compile now, before anything is timed; the seconds it took."""
        self._graph()
        assert self.compile_s is not None  # set by the compile
        return self.compile_s
