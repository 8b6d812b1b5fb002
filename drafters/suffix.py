"""SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): draft from what followed the
current suffix in the prompt *and in the outputs of earlier requests*.

No model. Two sources are searched each step, as in the paper: this request's own tokens
(prompt + generated so far) and a cache of earlier requests' outputs, shared by every
sequence one drafter decodes (a `SpeculativeDecoder` serving many prompts, a benchmark
running a dataset). For each match length p (the last p tokens occurred before), the
continuations of those occurrences form a frequency trie (the suffix tree's subtree under
the matched node); a tree is grown from it best-first by estimated probability (the
product of child count / parent count along the path), at most ``alpha * p + offset``
nodes and none below ``min_token_prob``; the candidate with the highest score (sum of its
nodes' probabilities) over match lengths and sources wins. Deterministic (``probs=None``),
siblings distinct: lossless with every exact verifier.

Where scoring more rows costs more (a CPU: the run's cost table), the winner is cut to the
size that pays (``price``): its best-first prefix of k nodes (always a tree) maximising
expected tokens per unit of time, (1 + c * sum of the k probabilities) / (t(k + 1) / t(1)),
c calibrating the counts' probabilities by what was accepted so far (one occurrence says
"probability 1"; the target agrees far less often). The paper's budget alone drafts up to
``alpha * p`` nodes whatever they cost.

The cache is bounded (oldest requests evicted first, by count and by tokens) and can be
persisted to a JSON file (``cache_path``: checked when the drafter is built, before a model
loads; loaded then, and rewritten atomically when each request ends, `Drafter.end`). Processes
sharing one ``cache_path`` take turns (a lock in spec-zoo's cache) and each save merges what the
others saved since, so no process's outputs are lost. A
request's output is filed under the source the benchmark names (`DecodeState.request_id`);
while a sequence of source s runs, everything s produced before is hidden, so a repeated
measurement never drafts its own earlier answer.
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import json
import os
import sys
import uuid
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

import torch

from spec_zoo.draft import ROOT, Draft
from spec_zoo.errors import ConfigError, first_line
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.outputs import atomic_write, check_writable, lock_path, one_writer, resolved
from spec_zoo.stats import StepStats

Occurrence = tuple[list[int], int]  # (a token sequence, index of the last matched token in it)
Tree = tuple[list[int], list[int], list[float]]  # best-first tokens, parents, each node's estimated probability
CALIBRATION_PRIOR = 4.0  # predicted tokens' worth of belief in the counts before any verdict (calibration 1)
CALIBRATION_DECAY = 0.99  # weight of past drafts per new one (memory of ~100 drafts)
IDLE_DECAY = 0.9  # per step that drafted nothing: the evidence fades toward the prior, so a low calibration
                  # that stopped drafting recovers and tries again (no verdict would ever raise it)


class SuffixCache:
    """Earlier requests' outputs, indexed by token, within ``max_requests`` outputs and
    ``max_tokens`` tokens (the oldest evicted first).

    An output is filed under a ``key`` (source and prompt): adding one with a key already
    held replaces the old output (a repeat does not count twice). Keys and sources are kept
    as text, so a cache saved and loaded again (a resumed benchmark) hides the same outputs.
    The index maps each token to the positions, per output, where it is followed by another
    token, so a lookup touches only occurrences of the current last token, and eviction drops an output's entries.
    """

    FORMAT = "spec-zoo-suffix-cache-v1"

    def __init__(self, max_requests: int = 1000, max_tokens: int = 200_000):
        self.max_requests, self.max_tokens = max_requests, max_tokens
        self.outputs: OrderedDict[int, tuple[Hashable, Hashable, list[int]]] = OrderedDict()  # id -> key, source, ids
        self.by_key: dict[Hashable, int] = {}
        self.index: dict[int, dict[int, list[int]]] = {}  # token -> output id -> positions followed by a token
        self.tokens = 0
        self._next_id = 0
        self._seen: bytes | None = None  # the saved file as last loaded or saved (`_stamp`): unchanged, no merge

    def __len__(self) -> int:
        return len(self.outputs)

    def add(self, tokens: list[int], source: Hashable, key: Hashable) -> None:
        """File an output (replacing the one of the same ``key``), then evict to the bounds."""
        key, source = str(key), str(source)
        if key in self.by_key:
            self._remove(self.by_key[key])
        if not tokens or len(tokens) > self.max_tokens or self.max_requests == 0:
            return
        oid, self._next_id = self._next_id, self._next_id + 1
        tokens = list(tokens)
        self.outputs[oid] = (key, source, tokens)
        self.by_key[key] = oid
        self.tokens += len(tokens)
        for pos, token in enumerate(tokens[:-1]):
            self.index.setdefault(token, {}).setdefault(oid, []).append(pos)
        while len(self.outputs) > self.max_requests or self.tokens > self.max_tokens:
            self._remove(next(iter(self.outputs)))

    def _remove(self, oid: int) -> None:
        key, _, tokens = self.outputs.pop(oid)
        del self.by_key[key]
        self.tokens -= len(tokens)
        for token in set(tokens[:-1]):
            where = self.index[token]
            del where[oid]
            if not where:
                del self.index[token]

    def occurrences(self, token: int, hidden: Hashable | None, limit: int) -> list[Occurrence]:
        """Up to ``limit`` positions of ``token`` followed by another token, most recent
        output first, skipping outputs of the source ``hidden``."""
        found: list[Occurrence] = []
        for oid, positions in reversed(self.index.get(token, {}).items()):
            _, source, tokens = self.outputs[oid]
            if hidden is not None and source == str(hidden):
                continue
            found += [(tokens, pos) for pos in reversed(positions[-(limit - len(found)):])]
            if len(found) >= limit:
                break
        return found

    def memory(self) -> dict:
        """What the cache holds: outputs, tokens, index entries, and the bytes of its Python
        objects (lists, dicts and ints, measured with ``sys.getsizeof``)."""
        entries = sum(len(p) for where in self.index.values() for p in where.values())
        size = sys.getsizeof(self.outputs) + sys.getsizeof(self.by_key) + sys.getsizeof(self.index)
        for key, _, tokens in self.outputs.values():
            size += sys.getsizeof(tokens) + 28 * len(tokens) + sys.getsizeof(key)
        for where in self.index.values():
            size += sys.getsizeof(where) + sum(sys.getsizeof(p) + 28 * len(p) for p in where.values())
        return {"requests": len(self.outputs), "tokens": self.tokens, "index_entries": entries, "bytes": size}

    def save(self, path: str | os.PathLike) -> None:
        """Write the outputs (oldest first) as JSON, atomically, holding the path's lock; what another
        process saved there since this one last read it is merged in first (its outputs, older than
        this one's newest), so two runs sharing a cache both keep what they filed."""
        with one_writer(lock_path(path)):
            if _stamp(path) not in (None, self._seen):
                mine = list(self.outputs.values())
                self.outputs.clear()
                self.by_key.clear()
                self.index.clear()
                self.tokens = 0
                self.load(path)
                for key, source, tokens in mine:
                    self.add(tokens, source, key)
            body = {"format": self.FORMAT, "saved": uuid.uuid4().hex, "outputs": [
                {"key": key, "source": source, "tokens": tokens} for key, source, tokens in self.outputs.values()]}
            atomic_write(path, json.dumps(body))
            self._seen = _stamp(path)

    def load(self, path: str | os.PathLike) -> None:
        """Add the outputs saved by `save`; a file that is not one (unreadable, not JSON, another
        format, a field of the wrong type) raises a one-line `ConfigError` and is left as it is."""
        fix = "point drafter.cache_path at a new file, or delete this one if spec-zoo wrote it"
        stamp = _stamp(path)  # before reading: a save in between changes it, so the next save merges
        try:
            body = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"drafter.cache_path: {path} cannot be read as a suffix cache ({first_line(err)}); "
                              f"{fix}.") from None
        if not isinstance(body, dict) or body.get("format") != self.FORMAT:
            found = f"format={body.get('format')!r:.40}" if isinstance(body, dict) else f"a JSON {type(body).__name__}"
            raise ConfigError(f"drafter.cache_path: {path} holds {found}, not a suffix cache spec-zoo wrote; {fix}.")
        try:
            outputs = [(_text(o["key"]), _text(o["source"]), [_token(t) for t in o["tokens"]]) for o in body["outputs"]]
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"drafter.cache_path: {path} is not a suffix cache spec-zoo wrote "
                              f"({first_line(err)}); {fix}.") from None
        for key, source, tokens in outputs:
            self.add(tokens, source, key)
        self._seen = stamp


def _stamp(path) -> bytes | None:
    """What identifies one saved version of the file ``path`` (None: there is none): its head, which
    holds the id each `SuffixCache.save` writes first (inode and mtime repeat across quick saves)."""
    try:
        with open(path, "rb") as f:
            return f.read(128)
    except OSError:
        return None


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a key or source is {value!r:.30}, not text")
    return value


def _token(value) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"a token is {value!r:.30}, not a token id")
    return value


def check_cache_path(cache_path) -> Path:
    """``drafter.cache_path`` `resolved`, checked before any decoding (and before a model loads):
    a file (not a directory) in a directory the cache can be written to. Loading it checks the rest."""
    path = resolved(cache_path)
    if path.is_dir():
        raise ConfigError(f"drafter.cache_path: {path} is a directory; give a JSON file path, e.g. "
                          f"drafter.cache_path={path / 'suffix_cache.json'}.")
    check_writable(path.parent, "drafter.cache_path")
    return path


class _SequenceIndex:
    """This request's own tokens (prompt + generated), indexed incrementally by token."""

    def __init__(self):
        self.positions: dict[int, list[int]] = {}
        self.indexed = 0

    def extend(self, tokens: list[int]) -> None:
        # positions < len - 1 only: the current last token never matches itself
        for pos in range(self.indexed, len(tokens) - 1):
            self.positions.setdefault(tokens[pos], []).append(pos)
        self.indexed = max(self.indexed, len(tokens) - 1)

    def occurrences(self, tokens: list[int], limit: int) -> list[Occurrence]:
        return [(tokens, pos) for pos in reversed(self.positions.get(tokens[-1], [])[-limit:])]


def match_length(context: list[int], seq: list[int], pos: int, longest: int) -> int:
    """How many tokens before and at ``seq[pos]`` equal the end of ``context`` (at most ``longest``)."""
    n = 1
    while n < longest and pos - n >= 0 and n < len(context) and seq[pos - n] == context[-1 - n]:
        n += 1
    return n


def grow_tree(continuations: list[list[int]], budget: int, min_prob: float, branching: bool) -> Tree:
    """The best-first frequency tree over ``continuations`` (what followed each matched
    occurrence): nodes in order of estimated probability, at most ``budget`` of them, none
    below ``min_prob``; without ``branching``, one chain of most frequent children.
    Returns (tokens, parents, probabilities); every prefix of it is a tree too, and its
    score is the sum of the probabilities (the expected accepted length, if they were right)."""
    children: list[dict[int, int]] = [{}]  # trie: node -> token -> child node
    counts = [len(continuations)]
    for continuation in continuations:
        node = 0
        for token in continuation:
            child = children[node].get(token)
            if child is None:
                child = children[node][token] = len(counts)
                children.append({})
                counts.append(0)
            counts[child] += 1
            node = child
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap = [(-counts[c] / counts[0], c, t, ROOT) for t, c in children[0].items()]
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg_prob, node, token, parent = heapq.heappop(heap)
        if -neg_prob < min_prob:
            break
        at = len(tokens)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_prob)
        if not branching:
            heap = []
        for t, c in children[node].items():
            heapq.heappush(heap, (neg_prob * counts[c] / counts[node], c, t, at))
    return tokens, parents, probs


def score(tree: Tree) -> float:
    """A tree's expected accepted length by its counts: the sum of its nodes' probabilities."""
    return sum(tree[2])


def priced_size(probs: list[float], relative_cost, calibration: float) -> int:
    """How many leading nodes of a best-first tree to draft: the k maximising expected
    tokens per step time, (1 + calibration * sum(probs[:k])) / relative_cost(k + 1), where
    ``relative_cost(m)`` is t(m) / t(1). 0 when no draft pays for its rows."""
    best_k, best_rate, gain = 0, 1.0, 1.0
    for k, p in enumerate(probs, 1):
        gain += calibration * p
        rate = gain / relative_cost(k + 1)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


class SuffixDrafter(Drafter):
    """SuffixDecoding over this request's tokens and a bounded cache of earlier outputs.

    ``max_match``: longest suffix matched (the paper's tree depth); ``alpha`` and ``offset``:
    a match of p tokens drafts at most ``alpha * p + offset`` nodes (``max_spec`` at most);
    ``min_token_prob``: nodes less likely than this are not drafted; ``tree``: False drafts
    one chain. ``max_occurrences``: occurrences read per lookup (the most recent), which
    bounds a step's work. ``price``: cut each tree to the size that pays by the run's cost
    table (no table: the budget alone). ``max_requests`` / ``max_tokens``: the cache's bounds;
    ``cache_path``: a JSON file the cache is loaded from and saved to after each request.
    """

    name = "suffix"

    def __init__(
        self,
        max_match: int = 24,
        alpha: float = 1.0,
        offset: float = 0.0,
        max_spec: int = 16,
        min_token_prob: float = 0.1,
        tree: bool = True,
        max_occurrences: int = 64,
        max_requests: int = 1000,
        max_tokens: int = 200_000,
        cache_path: str | None = None,
        price: bool = True,
    ):
        for key, value, low in (("max_match", max_match, 1), ("max_spec", max_spec, 1),
                                ("max_occurrences", max_occurrences, 1), ("max_requests", max_requests, 0),
                                ("max_tokens", max_tokens, 0)):
            if value < low:
                raise ConfigError(f"drafter.{key}={value}; it must be an integer >= {low}.")
        if alpha <= 0 or not 0.0 <= min_token_prob <= 1.0:
            raise ConfigError(f"drafter.alpha={alpha}, drafter.min_token_prob={min_token_prob}: "
                              "alpha must be > 0 and min_token_prob in [0, 1].")
        self.max_match, self.alpha, self.offset, self.max_spec = max_match, alpha, offset, max_spec
        self.min_token_prob, self.branching, self.max_occurrences = min_token_prob, tree, max_occurrences
        self.cache = SuffixCache(max_requests, max_tokens)
        self.cache_path = check_cache_path(cache_path) if cache_path else None
        if self.cache_path is not None and self.cache_path.exists():
            self.cache.load(self.cache_path)
        self._request: tuple[list[int], int, Hashable, Hashable] | None = None  # tokens, prompt_len, source, key
        self._own = _SequenceIndex()
        self._hidden: Hashable | None = None
        self.price = price
        self._drafted_prob = 0.0  # the last draft's predicted accepted length (sum of its probabilities)
        self._predicted = self._accepted = 0.0  # decayed sums over earlier drafts: what the counts said, what was

    @property  # computes the attribute Drafter declares (ComposedDrafter sets it per instance)
    def drafts_trees(self) -> bool:  # type: ignore[override]
        return self.branching

    batches = True

    def for_sequence(self, slot: int) -> Drafter:
        """Its own request index and calibration; the cache of earlier outputs is shared, so a
        request drafts from every request filed before its steps (in a batch, those that ended
        first): its drafts, never its greedy output, depend on its batch."""
        twin = copy.copy(self)
        twin._request, twin._own, twin._hidden = None, _SequenceIndex(), None
        twin._drafted_prob = twin._predicted = twin._accepted = 0.0
        return twin

    def begin(self, state: DecodeState) -> None:
        self.finish()
        source = state.request_id
        if source is None:  # a plain generate() call: its own source (unique across processes), nothing hidden
            key = source = f"request {uuid.uuid4().hex}"
            self._hidden = None
        else:  # one output per source and prompt; the prompt's text hash is stable across runs
            prompt = ",".join(map(str, state.tokens[: state.prompt_len]))
            key, self._hidden = f"{source}|{hashlib.sha256(prompt.encode()).hexdigest()[:16]}", source
        self._request = (state.tokens, state.prompt_len, source, key)
        self._own = _SequenceIndex()

    def end(self, state: DecodeState) -> None:
        self.finish()

    def finish(self) -> None:
        """File the last sequence's output in the cache and save it (`end` calls it when the
        sequence ends; the next `begin` does for one that did not end)."""
        if self._request is None:
            return
        tokens, prompt_len, source, key = self._request
        self._request = None
        self.cache.add(tokens[prompt_len:], source, key)
        if self.cache_path:
            self.cache.save(self.cache_path)

    def propose(self, state: DecodeState) -> Draft:
        context = state.tokens
        self._own.extend(context)
        limit = min(self.max_spec, state.max_depth)
        tokens, parents, probs = max((self._speculate(context, found, limit) for found in (
            self._own.occurrences(context, self.max_occurrences),
            self.cache.occurrences(context[-1], self._hidden, self.max_occurrences))), key=score)
        if self.price and state.cost_table is not None and tokens:
            keep = priced_size(probs, state.cost_table.relative, self.calibration)
            tokens, parents, probs = tokens[:keep], parents[:keep], probs[:keep]
        self._drafted_prob = sum(probs)
        return Draft(torch.tensor(tokens, dtype=torch.long), parents) if tokens else Draft.empty()

    @property
    def calibration(self) -> float:
        """Accepted tokens per token the counts predicted, over recent drafts (1 before any)."""
        return (self._accepted + CALIBRATION_PRIOR) / (self._predicted + CALIBRATION_PRIOR)

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        if self._drafted_prob > 0:  # what was accepted, not the clock: seeded runs stay reproducible
            self._predicted = CALIBRATION_DECAY * self._predicted + self._drafted_prob
            self._accepted = CALIBRATION_DECAY * self._accepted + len(verdict.path)
        else:
            self._predicted, self._accepted = IDLE_DECAY * self._predicted, IDLE_DECAY * self._accepted
        self._drafted_prob = 0.0

    def _speculate(self, context: list[int], found: list[Occurrence], limit: int) -> Tree:
        """The best-scoring tree over the match lengths of ``found`` (longer matches first)."""
        matched = sorted(((match_length(context, seq, pos, self.max_match), seq, pos) for seq, pos in found),
                         key=lambda m: -m[0])
        best: Tree = ([], [], [])
        for i, (length, _, _) in enumerate(matched):
            if i + 1 < len(matched) and matched[i + 1][0] == length:
                continue  # the occurrences matching at least `length` tokens are matched[: i + 1]
            budget = min(limit, int(self.alpha * length + self.offset + 1e-6))
            if budget < 1:
                continue
            continuations = [seq[pos + 1: pos + 1 + limit] for _, seq, pos in matched[: i + 1]]
            best = max(best, grow_tree(continuations, budget, self.min_token_prob, self.branching), key=score)
        return best
