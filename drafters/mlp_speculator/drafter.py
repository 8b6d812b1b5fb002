"""``drafter=mlp_speculator``: draft a chain or a tree with the MLP speculator
(`spec_zoo.drafters.mlp_speculator.speculator`) on the target's last hidden state; the
drafting itself is `spec_zoo.staged.StagedDrafter`'s (one stage per drafted token)."""

from __future__ import annotations

from pathlib import Path

from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator
from spec_zoo.staged import StagedDrafter


class MLPSpeculatorDrafter(StagedDrafter):
    __doc__ = StagedDrafter.__doc__

    name = "mlp_speculator"
    head_class = MLPSpeculator
    shipped = Path(__file__).parent / "artefacts" / "smollm2-135m-mlp-speculator"
    train_command = "spec-zoo-train mlp_speculator"
