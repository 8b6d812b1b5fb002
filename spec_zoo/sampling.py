"""Sampling parameters, the one logits -> probabilities function, and the decode's only
random choices.

Drafters and verifiers both call `logits_to_probs`, so the "p" (target) and "q"
(draft) that exact rejection sampling compares are computed the same way. Every random
choice of a decode (a drafter's draws, a tree's siblings, a verifier's coins and its
recovered token) goes through `sample`, `sample_distinct` or `accept`, which ask the
`Chooser` in effect: the run's generator by default, an enumerator under `spec_zoo.certify`,
which so obtains the exact output distribution of any drafter x verifier pair.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from spec_zoo.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is shaped.

    temperature: 0 means greedy (argmax); > 0 samples from softmax(logits / T).
    top_k:       keep only the k most likely tokens (0 = off).
    top_p:       keep the smallest set of tokens whose mass reaches top_p (1.0 = off).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ConfigError(
                f"generation.temperature={self.temperature} is negative; "
                "use 0 for greedy decoding or a positive value to sample."
            )
        if self.top_k < 0:
            raise ConfigError(f"generation.top_k={self.top_k} is negative; use 0 to disable top-k.")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(
                f"generation.top_p={self.top_p} is outside (0, 1]; use 1.0 to disable nucleus sampling."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities over the last dimension; one-hot at the argmax when greedy.

    Computed in float32 or wider so that p/q ratios are not dominated by rounding.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if params.greedy:
        probs = torch.zeros_like(logits)
        return probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


class Chooser:
    """Makes every random choice of a decode: the three primitives below ask the chooser in
    effect (`choosing`). This one draws with the run's generator, so a seed fixes the text;
    a certifier (`spec_zoo.certify`) swaps in one that enumerates every outcome instead."""

    def draw(self, probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])

    def draw_distinct(self, probs: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
        return torch.multinomial(probs, k, replacement=False, generator=generator).tolist()

    def accept(self, p: torch.Tensor, q: torch.Tensor | float, generator: torch.Generator | None) -> bool:
        device = generator.device if generator is not None else None
        u = torch.rand((), generator=generator, device=device)
        return bool(u * q < p)  # u < p/q without dividing by a zero q


_CHOOSER: contextvars.ContextVar[Chooser] = contextvars.ContextVar("spec_zoo_chooser", default=Chooser())  # noqa: B039 (stateless)


@contextmanager
def choosing(chooser: Chooser):
    """Within the block, every random choice of the decode is made by ``chooser``."""
    token = _CHOOSER.set(chooser)
    try:
        yield chooser
    finally:
        _CHOOSER.reset(token)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs`` ([..., V] -> [...]), each row a categorical
    distribution (normalised by its sum)."""
    return _CHOOSER.get().draw(probs, generator)


def sample_distinct(probs: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
    """``k`` distinct tokens drawn without replacement from ``probs`` [V], in draw order (each
    draw from what is left of ``probs``, renormalised); needs ``k`` tokens of nonzero mass."""
    return _CHOOSER.get().draw_distinct(probs, k, generator)


def accept(p: torch.Tensor, q: torch.Tensor | float, generator: torch.Generator | None) -> bool:
    """A coin that comes up True with probability min(1, p / q) (q = 0: True iff p > 0)."""
    return _CHOOSER.get().accept(p, q, generator)


SAMPLE_MODES = ("auto", True, False)


def check_sample_mode(mode) -> str | bool:
    """A drafter's ``sample`` setting, checked: "auto", True or False."""
    if mode not in SAMPLE_MODES:
        raise ConfigError(f"drafter.sample={mode!r}; allowed values: auto, true, false.")
    return mode


def drafts_sampled(mode: str | bool, params: SamplingParams) -> bool:
    """Whether a drafter with ``sample=mode`` samples its drafts in a run with ``params``:
    "auto" samples when the run samples (temperature > 0) and takes the argmax at 0."""
    return not params.greedy if mode == "auto" else bool(mode)


def draft_token(logits: torch.Tensor, sampled: bool, params: SamplingParams,
                generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """A drafter's next token from its logits [V]: a sample from q (returned, so exact
    verifiers can use it) when ``sampled``, else the argmax (q one-hot: None)."""
    if not sampled:
        return int(logits.argmax()), None
    q = logits_to_probs(logits, params)
    return int(sample(q.to(generator.device), generator)), q


def to_full_vocab(logits: torch.Tensor, vocab_ids: torch.Tensor | None, size: int) -> torch.Tensor:
    """Logits over a reduced draft vocabulary (last dim, ids ``vocab_ids``) as logits over all
    ``size`` tokens: -inf elsewhere, so q is exactly 0 there and exact verifiers stay exact."""
    if vocab_ids is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], size), float("-inf"))
    return full.index_copy_(-1, vocab_ids, logits)


def stop_string_list(stop_strings: str | Sequence[str] | None) -> tuple[str, ...]:
    """Stop strings as a tuple: one plain string is one stop string (not its characters);
    an empty one would match before any text, so it is refused."""
    if stop_strings is None:
        return ()
    items = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    for s in items:
        if not isinstance(s, str) or not s:
            raise ConfigError(
                f"generation.stop_strings: {s!r} is not a non-empty string; give text to stop at, "
                "e.g. generation.stop_strings=['\\n\\n'] (or [] for none)."
            )
    return items
