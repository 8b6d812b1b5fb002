"""Per-step and per-run statistics, named as in the literature.

tau:   mean tokens committed per target forward, bonus/recovered token included
       (plain decoding = 1.0).
alpha: accepted draft tokens / drafted tokens (None when nothing was drafted).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    drafted: int  # draft nodes scored by the target
    accepted: int  # nodes on the accepted path
    depth: int  # depth of the scored draft (= drafted for a chain)
    committed: int  # tokens committed this step (after EOS / length cut)
    draft_s: float
    verify_s: float  # target forward + verification + cache commit


@dataclass
class RunStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)

    @property
    def target_forwards(self) -> int:
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_forwards if self.steps else 0.0

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def draft_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def accept_per_position(self) -> list[float]:
        """Entry j: of the steps whose draft reached depth j + 1, the fraction that
        accepted at least j + 1 tokens (how far acceptance survives along a draft)."""
        depth = max((s.depth for s in self.steps), default=0)
        rates = []
        for j in range(depth):
            reached = [s for s in self.steps if s.depth > j]
            rates.append(sum(s.accepted > j for s in reached) / len(reached))
        return rates

    def summary(self) -> str:
        alpha = "n/a" if self.alpha is None else f"{self.alpha:.3f}"
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.2f} s ({self.tokens_per_s:.1f} tok/s) | "
            f"tau {self.tau:.2f} | alpha {alpha} | target forwards {self.target_forwards} | "
            f"draft {self.draft_s:.2f} s, verify {self.verify_s:.2f} s"
        )

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "target_forwards": self.target_forwards,
            "tau": self.tau,
            "alpha": self.alpha,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "accept_per_position": self.accept_per_position,
        }
