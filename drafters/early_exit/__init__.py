"""Self-speculation by early exit (LayerSkip; Kangaroo-style exit adapters).

drafter.py: `EarlyExitDrafter` (decoding); adapter.py: the trained exit adapter and its
artefact format; train.py: the ``spec-zoo-train early_exit`` recipe; artefacts/: shipped adapters.
"""

from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter

__all__ = ["EarlyExitDrafter"]
