"""EAGLE-style feature drafting (Li et al. 2024).

drafter.py: `EagleDrafter` (decoding); head.py: the trained head and its artefact format;
train.py: the ``spec-zoo-train eagle`` recipe; artefacts/: the shipped head.
"""

from spec_zoo.drafters.eagle.drafter import EagleDrafter

__all__ = ["EagleDrafter"]
