"""`StepTrace`: what each step of one spec-zoo generation drafted and accepted, as the
per-step columns of a bench record's trace (what `spec_zoo.report.projection` replays)."""

from __future__ import annotations

from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.trees import Auto, path_shape


class StepTrace:
    """What each step of one generation drafted and accepted, for replaying the run under
    another cost table (`spec_zoo.report.projection`): the accepted path's tree shape
    (`spec_zoo.trees.path_shape`) and, for ``tree=auto``, the (tokens, cost) its policy
    predicted. Subscribed to the decoder's step observers while in its ``with`` block."""

    def __init__(self, decoder: SpeculativeDecoder):
        self.decoder = decoder
        self.steps: list[tuple[list[int], list[int], tuple[float, float] | None]] = []
        policy = getattr(decoder.drafter, "tree", None)
        self.policy = policy if isinstance(policy, Auto) else None

    def __enter__(self) -> StepTrace:
        self.decoder.observers.append(self.observe)
        return self

    def __exit__(self, *exc) -> None:
        self.decoder.observers.remove(self.observe)

    def observe(self, draft, verdict, step) -> None:
        self.steps.append((draft.parents, verdict.path, self._prediction(draft)))

    def _prediction(self, draft) -> tuple[float, float] | None:
        if self.policy is None:
            return None
        if not len(draft) and self.policy.paths:  # the last step drafts nothing: no tree was planned
            return 1.0, 1.0
        return self.policy.prediction

    @property
    def predicted_speedup(self) -> float | None:
        """What ``tree=auto`` predicted for the run: its expected tokens over its predicted
        cost in target forwards, summed over steps (None for other drafters)."""
        predictions = [p for _, _, p in self.steps if p is not None]
        return sum(t for t, _ in predictions) / sum(c for _, c in predictions) if predictions else None

    def columns(self, stats) -> dict:
        """One list per quantity, entry i for step i (``stats``: the run's `RunStats`)."""
        shapes = [path_shape(parents, path) for parents, path, _ in self.steps]
        return {
            "drafted": [s.drafted for s in stats.steps], "depth": [s.depth for s in stats.steps],
            "committed": [s.committed for s in stats.steps], "draft_s": [s.draft_s for s in stats.steps],
            "verify_s": [s.verify_s for s in stats.steps], "widths": [w for w, _ in shapes],
            "ranks": [r for _, r in shapes], "predicted": [p and list(p) for _, _, p in self.steps],
        }
