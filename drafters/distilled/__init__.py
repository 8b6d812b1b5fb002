"""Distilled draft models: a small draft trained on the target's own outputs.

drafter.py: `DistilledDrafter` (decoding); student.py: the draft module and its artefact
format; train.py: the ``spec-zoo-train distill`` recipe; artefacts/: the shipped draft.
"""

from spec_zoo.drafters.distilled.drafter import DistilledDrafter

__all__ = ["DistilledDrafter"]
