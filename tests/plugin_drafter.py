"""A user drafter living outside spec-zoo, plugged in with ``drafter._target_=...``."""

from spec_zoo import Draft, Drafter


class RepeatDrafter(Drafter):
    """Proposes the last committed token ``num_draft`` times: trivial, but any drafter is
    lossless under an exact verifier, which is what the plug-in test checks."""

    name = "repeat"

    def __init__(self, num_draft: int = 2):
        self.num_draft = num_draft

    def propose(self, state):
        return Draft.chain([state.tokens[-1]] * self.num_draft)
