"""Which request a generation serves, for drafters that learn across requests.

A drafter that keeps what earlier requests produced (`drafters/suffix.py`) must not let a
benchmark measurement draft from an earlier run of its *own* prompt (a repeat would then
copy its own answer). The benchmark runner names the prompt it is measuring with
`request_source` (the question id); such a drafter reads `current_request_source` when a
sequence begins, hides what that source produced before, and files the new output under it.
Outside a scope (plain `generate()` calls) the source is None: nothing is hidden.
"""

from __future__ import annotations

import contextvars
from collections.abc import Hashable
from contextlib import contextmanager

_SOURCE: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("spec_zoo_request_source", default=None)


@contextmanager
def request_source(key: Hashable | None):
    """Generations inside this block serve the prompt ``key`` (e.g. a benchmark question id)."""
    token = _SOURCE.set(key)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def current_request_source() -> Hashable | None:
    """The prompt the running generation serves (None outside `request_source`)."""
    return _SOURCE.get()
