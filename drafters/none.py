"""No drafter: every step is plain autoregressive decoding (the baseline, ``drafter=none``)."""

from spec_zoo.draft import Draft
from spec_zoo.interfaces import DecodeState, Drafter


class NoDrafter(Drafter):
    """Proposes nothing, so the target commits exactly one token per forward (tau = 1)."""

    name = "none"
    batches = True

    def for_sequence(self, slot: int) -> Drafter:
        return self  # stateless

    def propose(self, state: DecodeState) -> Draft:
        return Draft.empty()
