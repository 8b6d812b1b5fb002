"""Parallel drafting (PARD): the distilled draft trained with mask tokens drafts k tokens in
one forward.

model.py: the mask-token embeddings and the artefact (a base distilled draft plus what
training changed); drafter.py: `ParallelDrafter` (decoding); train.py: the
``spec-zoo-train parallel`` recipe; artefacts/: the shipped parallel draft.
"""

from spec_zoo.drafters.parallel.drafter import ParallelDrafter

__all__ = ["ParallelDrafter"]
