"""Adaptive draft length: the heuristic transformers' assisted generation uses.

Grow by 2 after a fully accepted draft, shrink by 1 after a rejection. A long draft
that keeps failing costs target compute on every step; a short one that keeps being
accepted leaves speedup on the table.
"""

from __future__ import annotations

from spec_zoo.errors import ConfigError


class DraftLength:
    """Current draft length, fixed or adaptive within [1, maximum]."""

    def __init__(self, initial: int, adaptive: bool, maximum: int, key: str = "drafter"):
        if initial <= 0:
            raise ConfigError(f"{key}.num_draft={initial}; the draft length must be a positive integer (e.g. 4).")
        if adaptive and maximum < initial:
            raise ConfigError(
                f"{key}.max_draft={maximum} is below {key}.num_draft={initial}; raise max_draft or lower num_draft."
            )
        self.initial, self.adaptive, self.maximum = initial, adaptive, maximum
        self.value = initial

    def reset(self) -> None:
        self.value = self.initial

    def update(self, drafted: int, accepted: int) -> None:
        if not self.adaptive or drafted == 0:
            return
        if accepted == drafted:
            self.value = min(self.value + 2, self.maximum)
        else:
            self.value = max(self.value - 1, 1)
