"""The exact output distribution of a drafter x verifier pair, by enumerating every random
choice of the decode.

A decode's randomness is finite: the drafter's draws, the tree's siblings, the verifier's
coins and its recovered or bonus token, all made through `spec_zoo.sampling` (`sample`,
`sample_distinct`, `accept`). `certify` swaps the generator for an `Enumerator`, which
replays a prefix of recorded choices and takes the first outcome of every later one, and
walks the tree of choice sequences depth-first, one decode per leaf, each leaf weighted
by the product of its choices' probabilities (outcomes of probability 0 are never taken).
The result is the exact law of the generated tokens (float64), compared with the target's
own law under the same sampling parameters: total variation 0 up to rounding is a proof
of losslessness for that model and prompt, not a p-value; a lossy rule gets its exact
distance. The same walk gives exact expectations (tokens per step).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Drafter, Verifier
from spec_zoo.sampling import Chooser, SamplingParams, choosing, logits_to_probs

BUDGET = 20_000  # decodes (leaves of the choice tree) one certificate may run

Outcomes = list[tuple[object, float]]  # (value, probability > 0)


def categorical(row: torch.Tensor) -> list[tuple[int, float]]:
    """The tokens of nonzero mass in ``row`` [V] and their probabilities (normalised, float64)."""
    row = row.double()
    total = float(row.sum())
    if not total > 0:
        raise ValueError("a categorical draw from a row without mass")
    return [(int(i), float(row[i]) / total) for i in torch.nonzero(row).flatten().tolist()]


def ordered_distinct(row: torch.Tensor, k: int) -> Outcomes:
    """Every ordered ``k``-tuple of distinct tokens drawn without replacement from ``row``,
    with its probability: the product of each draw's mass over what was left."""
    row = row.double()
    out: Outcomes = []

    def extend(drawn: tuple[int, ...], prob: float, left: float) -> None:
        if len(drawn) == k:
            out.append((list(drawn), prob))
            return
        for token in torch.nonzero(row).flatten().tolist():
            if token not in drawn:
                mass = float(row[token])
                extend((*drawn, token), prob * mass / left, left - mass)

    extend((), 1.0, float(row.sum()))
    return out


def coin(p, q) -> Outcomes:
    """True with probability min(1, p / q) (q = 0: True iff p > 0), else False."""
    p, q = float(p), float(q)
    a = (1.0 if p > 0 else 0.0) if q == 0 else min(1.0, p / q)
    return [(value, prob) for value, prob in ((True, a), (False, 1.0 - a)) if prob > 0]


class Enumerator(Chooser):
    """A chooser that follows ``prefix`` (outcome indices of the first choices, with the
    number of outcomes each had, to check the replay), then the first outcome of every
    later choice; ``choices`` records each choice's outcomes and ``taken`` the indices."""

    def __init__(self, prefix: Sequence[tuple[int, int]] = ()):
        self.prefix = list(prefix)
        self.choices: list[Outcomes] = []
        self.taken: list[int] = []

    def choose(self, outcomes: Outcomes):
        j = len(self.choices)
        index = 0
        if j < len(self.prefix):
            index, count = self.prefix[j]
            if count != len(outcomes):
                raise RuntimeError(
                    f"certify: replaying choice {j} found {len(outcomes)} outcomes instead of {count}: the decode "
                    "is not a function of its random choices (state carried between runs, a clock, or a draw "
                    "outside spec_zoo.sampling).")
        self.choices.append(outcomes)
        self.taken.append(index)
        return outcomes[index][0]

    @property
    def probability(self) -> float:
        return math.prod(outcomes[i][1] for outcomes, i in zip(self.choices, self.taken))

    def draw(self, probs, generator):
        rows = probs.reshape(-1, probs.shape[-1])
        outcomes = [([value for value, _ in combo], math.prod(prob for _, prob in combo))
                    for combo in itertools.product(*(categorical(row) for row in rows))]
        tokens = self.choose(outcomes)
        return torch.tensor(tokens, dtype=torch.long, device=probs.device).reshape(probs.shape[:-1])

    def draw_distinct(self, probs, k, generator):
        return self.choose(ordered_distinct(probs, k))

    def accept(self, p, q, generator):
        return self.choose(coin(p, q))


class ForwardMemo:
    """Within the block, a forward of a model of class ``cls`` is looked up by its weights,
    its inputs and its KV cache's content: decodes of one certificate share their first
    steps, which are then computed once (the cache is set to its stored state after the
    call, so a hit is the forward's exact effect, bit for bit)."""

    def __init__(self, cls: type):
        self.cls = cls
        self.memo: dict[bytes, tuple] = {}  # forward key -> (output class, its fields, the cache's layers after)
        self.weights: weakref.WeakKeyDictionary[torch.nn.Module, bytes] = weakref.WeakKeyDictionary()

    def __enter__(self):
        self.original = self.cls.forward
        memo = self

        def forward(module, *args, **kwargs):
            return memo.call(module, args, kwargs)

        self.cls.forward = forward
        return self

    def __exit__(self, *exc):
        self.cls.forward = self.original

    def key(self, module, args, kwargs) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        if module not in self.weights:
            weights = hashlib.blake2b(digest_size=16)
            for tensor in module.state_dict().values():
                weights.update(tensor.detach().cpu().numpy().tobytes())
            self.weights[module] = weights.digest()
        digest.update(self.weights[module])
        for name, value in [*enumerate(args), *sorted(kwargs.items())]:
            digest.update(repr(name).encode())
            if isinstance(value, torch.Tensor):
                digest.update(f"{value.dtype}{tuple(value.shape)}".encode() + value.detach().cpu().numpy().tobytes())
            elif hasattr(value, "layers"):  # a KV cache: its content
                for layer in value.layers:
                    if getattr(layer, "is_initialized", False):
                        for tensor in (layer.keys, layer.values):
                            digest.update(str(tuple(tensor.shape)).encode() + tensor.cpu().numpy().tobytes())
                    digest.update(b"|")
            else:
                digest.update(repr(value).encode())
        return digest.digest()

    def call(self, module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        key = self.key(module, args, kwargs)
        if key not in self.memo:
            out = self.original(module, *args, **kwargs)
            fields = {name: _cloned(value) for name, value in out.items() if value is not cache}
            self.memo[key] = (type(out), fields, _layers(cache) if cache is not None else None)
            return out
        kind, fields, layers = self.memo[key]
        if cache is not None:
            cache.layers = _layers(layers)
        out = kind(**{name: _cloned(value) for name, value in fields.items()})
        if cache is not None:
            out["cache"] = cache
        return out


def _layers(cache_or_layers) -> list:
    """A copy of a KV cache's layers (their tensors cloned)."""
    layers = getattr(cache_or_layers, "layers", cache_or_layers)
    out = []
    for layer in layers:
        new = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            new.keys, new.values = layer.keys.clone(), layer.values.clone()
        out.append(new)
    return out


def _cloned(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_cloned(v) for v in value)
    return value


@dataclass
class Certificate:
    """law / target: {generated tokens: probability} under the pair and under the target
    alone; tv: their total variation; tau: the expected tokens per target forward of a run
    (`RunStats.tau`); first_step: the expected tokens the first step commits (1 + its
    expected accepted draft tokens, when ``length`` leaves room); branches: decodes run."""

    law: dict[tuple[int, ...], float]
    target: dict[tuple[int, ...], float]
    tv: float
    tau: float
    first_step: float
    branches: int


def target_law(model, sampling: SamplingParams, prompt: Sequence[int], length: int) -> dict[tuple[int, ...], float]:
    """{x: P(x)} over the ``length`` tokens the target alone samples after ``prompt``
    (one batched forward per position over the prefixes of nonzero probability)."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    device = next(model.parameters()).device
    for _ in range(length):
        prefixes = list(law)
        ids = torch.tensor([list(prompt) + list(x) for x in prefixes], device=device)
        with torch.no_grad():
            probs = logits_to_probs(model(ids).logits[:, -1].double(), sampling)
        law = {(*x, token): law[x] * prob for x, row in zip(prefixes, probs) for token, prob in categorical(row)}
    return law


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in a.keys() | b.keys())


def certify(
    target_factory: Callable[[], torch.nn.Module],
    drafter_factory: Callable[[torch.nn.Module], Drafter],
    verifier: Verifier,
    sampling: SamplingParams,
    prompt: Sequence[int],
    length: int,
    budget: int = BUDGET,
) -> Certificate:
    """The exact law of the first ``length`` tokens generated after ``prompt`` by
    ``drafter_factory(model)`` x ``verifier`` (a fresh drafter per decode, so nothing it
    learns carries over), against the target's own law; ``target_factory()`` builds the
    target model once (float64, e.g. `spec_zoo.testing.tiny_llama` with a vocabulary of
    4-8 tokens). Raises `ConfigError` as the decoder does when the verifier refuses the
    drafter or the sampling, or when the choice tree has more than ``budget`` leaves."""
    model = target_factory()
    with ForwardMemo(type(model)):
        law, tau, first_step, runs = _enumerate(model, drafter_factory, verifier, sampling, prompt, length, budget)
    target = target_law(model, sampling, prompt, length)
    return Certificate(law, target, total_variation(law, target), tau, first_step, runs)


def explore(run: Callable[[], object], budget: int = BUDGET, what: str = "") -> Iterator[tuple[object, float]]:
    """(run's result, its probability) for every sequence of random choices ``run`` can make
    through `spec_zoo.sampling` (outcomes of probability 0 pruned): depth-first, ``run``
    called once per sequence under an `Enumerator`. ``run`` must be a function of its
    choices alone. Raises `ConfigError` when there are more than ``budget`` sequences."""
    stack: list[tuple[tuple[int, int], ...]] = [()]
    runs = 0
    while stack:
        prefix = stack.pop()
        runs += 1
        if runs + len(stack) > budget:
            raise ConfigError(f"certify: more than budget={budget} decodes to enumerate{what}; shrink the length, "
                              "the vocabulary, the draft length or tree, or sample with top_k/top_p, or raise budget=.")
        with choosing(Enumerator(prefix)) as chooser:
            result = run()
        yield result, chooser.probability
        path = [(index, len(outcomes)) for outcomes, index in zip(chooser.choices, chooser.taken)]
        for j in range(len(prefix), len(path)):  # branch at every choice made after the prefix
            for index in range(1, len(chooser.choices[j])):
                stack.append((*path[:j], (index, len(chooser.choices[j]))))


def _enumerate(model, drafter_factory, verifier, sampling, prompt, length, budget):
    """(law, expected tau, expected first step, decodes) over every choice sequence of the decode."""
    from spec_zoo.decoder import SpeculativeDecoder
    from spec_zoo.runtime.target import Target

    target = Target(model)  # reset by every decode

    def decode():
        decoder = SpeculativeDecoder(target, drafter_factory(model), verifier, sampling)
        return decoder.generate(list(prompt), max_new_tokens=length, eos_token_ids=[])

    law: dict[tuple[int, ...], float] = {}
    tau = first_step = 0.0
    runs = 0
    what = f" (length={length}, a {model.config.vocab_size}-token vocabulary, {sampling})"
    for out, weight in explore(decode, budget, what):
        runs += 1
        ids = tuple(out.ids)
        law[ids] = law.get(ids, 0.0) + weight
        tau += weight * out.stats.tau
        first_step += weight * out.stats.steps[0].committed
    return law, tau, first_step, runs
