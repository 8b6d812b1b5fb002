"""Medusa-style heads (Cai et al. 2024): K heads on the target's last hidden state.

drafter.py: `MedusaDrafter` (decoding, chain or static tree); heads.py: the trained heads and
their artefact format; train.py: the ``spec-zoo-train medusa`` recipe; artefacts/: the shipped heads.
"""

from spec_zoo.drafters.medusa.drafter import MedusaDrafter

__all__ = ["MedusaDrafter"]
