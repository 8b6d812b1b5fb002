"""A deliberately slow drafter for tests that must interrupt a benchmark mid-run."""

import time

from spec_zoo.drafters.none import NoDrafter


class SlowNoDrafter(NoDrafter):
    """Plain decoding that sleeps ``delay`` seconds per step."""

    name = "slow"

    def __init__(self, delay: float = 0.02):
        self.delay = delay

    def propose(self, state):
        time.sleep(self.delay)
        return super().propose(state)
