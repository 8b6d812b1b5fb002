"""Hydra heads (Ankner et al. 2024): Medusa heads that also read the tokens drafted before
their own, on the target's last hidden state.

heads.py: the heads and their artefact format; drafter.py: `HydraDrafter` (decoding, chain or
tree); train.py: the ``spec-zoo-train hydra`` recipe; artefacts/: the shipped heads.
"""

from spec_zoo.drafters.hydra.drafter import HydraDrafter

__all__ = ["HydraDrafter"]
