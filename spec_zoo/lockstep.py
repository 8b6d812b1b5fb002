"""Drafting as steps that ask for their model calls, so a batch's sequences can draft in lockstep.

A drafter with its own model (an EAGLE head) calls it once per draft level. A batch of B
sequences drafting one after another makes B calls per level, each a small forward that
costs about what B rows in one forward cost on a CPU's GEMM (weights read once per call).
Written as a generator that *yields* each call it needs and is *sent* the answer, the same
drafting code runs three ways:

- `drive`: alone, every ask answered at once (a sequence decoded by itself);
- `relay`: inside another such generator, a policy's asks (a tree policy's "expand these
  nodes", a chain's "feed this token") answered by the drafter's own model calls, which go out;
- `together`: B generators advanced side by side, each round's asks answered by one batched
  call per server (`answer_all`), until every one has returned its draft.

An ask names the ``server`` that answers it: an object whose ``together(asks)`` answers a list of
its asks in one call (`spec_zoo.runtime.compiled_head.CompiledHead`, whose asks are `HeadRows`; a draft
model's `spec_zoo.runtime.target.Target`, whose asks are `NextLogits`). Each
sequence's generator sees exactly the answers it would get alone when that call is batch
invariant (the compiled head's rows are), so its draft is the one it drafts alone. A drafter
without model calls to share drafts in one step (`spec_zoo.interfaces.Drafter.drafting`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

Result = TypeVar("Result")
Steps = Generator[Any, Any, Result]  # yields asks, is sent their answers, returns its result


def answer(ask: Any) -> Any:
    """One ask answered alone by its server."""
    return ask.server.together([ask])[0]


def answer_all(asks: list[Any]) -> list[Any]:
    """Every ask answered, in order, with one call per server (all of a server's asks at once)."""
    by_server: dict[int, list[int]] = {}
    for i, ask in enumerate(asks):
        by_server.setdefault(id(ask.server), []).append(i)
    answers: list[Any] = [None] * len(asks)
    for rows in by_server.values():
        for i, given in zip(rows, asks[rows[0]].server.together([asks[i] for i in rows]), strict=True):
            answers[i] = given
    return answers


def drive(steps: Steps[Result], answer: Callable[[Any], Any]) -> Result:
    """Run ``steps`` to its result, each ask answered by ``answer(ask)``."""
    try:
        ask = next(steps)
        while True:
            ask = steps.send(answer(ask))
    except StopIteration as done:
        return done.value


def relay(steps: Steps[Result], serve: Callable[[Any], Steps[Any]]) -> Steps[Result]:
    """``steps`` run inside a generator: each of its asks answered by the generator ``serve(ask)``,
    whose own asks go out to whoever runs this one."""
    try:
        ask = next(steps)
        while True:
            ask = steps.send((yield from serve(ask)))
    except StopIteration as done:
        return done.value


def together(all_steps: list[Steps[Result]], enter: Callable[[int], None] | None = None,
             leave: Callable[[int], None] | None = None) -> list[Result]:
    """Every generator of ``all_steps`` run to its result side by side: each round, the asks of
    those still running answered together (`answer_all`). ``enter(i)`` and ``leave(i)`` run around
    each advance of generator i (the decoder makes the target hold that sequence meanwhile)."""
    results: list[Any] = [None] * len(all_steps)
    asking: dict[int, Any] = {}

    def advance(i: int, given: Any, first: bool = False) -> None:
        if enter is not None:
            enter(i)
        try:
            asking[i] = next(all_steps[i]) if first else all_steps[i].send(given)
        except StopIteration as done:
            asking.pop(i, None)
            results[i] = done.value
        finally:
            if leave is not None:
                leave(i)

    for i in range(len(all_steps)):
        advance(i, None, first=True)
    while asking:
        order = list(asking)
        for i, given in zip(order, answer_all([asking[i] for i in order]), strict=True):
            advance(i, given)
    return results
