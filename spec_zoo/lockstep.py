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
  call (`spec_zoo.compiled_head.CompiledHead.together`), until every one has returned its draft.

Each sequence's generator sees exactly the answers it would get alone when the batched call
is batch invariant (the compiled head's rows are), so its draft is the one it drafts alone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

Result = TypeVar("Result")
Steps = Generator[Any, Any, Result]  # yields asks, is sent their answers, returns its result


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


def together(all_steps: list[Steps[Result]], answer_all: Callable[[list[Any]], list[Any]]) -> list[Result]:
    """Every generator of ``all_steps`` run to its result side by side: each round, the asks of
    those still running answered by one ``answer_all(asks)`` call (one answer per ask, in order)."""
    results: list[Any] = [None] * len(all_steps)
    asking: dict[int, Any] = {}

    def advance(i: int, answer: Any, first: bool = False) -> None:
        try:
            asking[i] = next(all_steps[i]) if first else all_steps[i].send(answer)
        except StopIteration as done:
            asking.pop(i, None)
            results[i] = done.value

    for i in range(len(all_steps)):
        advance(i, None, first=True)
    while asking:
        order = list(asking)
        for i, answer in zip(order, answer_all([asking[i] for i in order]), strict=True):
            advance(i, answer)
    return results
