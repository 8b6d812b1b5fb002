"""A plugin drafter: proposes the last committed token ``num_draft`` times (trivial, but any
drafter is lossless under an exact verifier, which is what the plugin test checks)."""

from spec_zoo import Draft, Drafter


class RepeatDrafter(Drafter):
    """Repeats the last committed token (a test plugin)."""

    name = "repeat"

    def __init__(self, num_draft: int = 2):
        self.num_draft = num_draft

    def propose(self, state):
        return Draft.chain([state.tokens[-1]] * self.num_draft)


class NotADrafter:
    """Registered by mistake in the error test: not a `Drafter`."""
