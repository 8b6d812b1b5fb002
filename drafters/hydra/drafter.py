"""``drafter=hydra``: draft a chain or a tree with Hydra heads (`spec_zoo.drafters.hydra.heads`)
on the target's last hidden state; the drafting itself is `spec_zoo.staged.StagedDrafter`'s
(head i reads the tokens drafted before it, so each tree node has its own distribution)."""

from __future__ import annotations

from pathlib import Path

from spec_zoo.drafters.hydra.heads import HydraHeads
from spec_zoo.staged import StagedDrafter


class HydraDrafter(StagedDrafter):
    __doc__ = StagedDrafter.__doc__

    name = "hydra"
    head_class = HydraHeads
    shipped = Path(__file__).parent / "artefacts" / "smollm2-135m-hydra"
    train_command = "spec-zoo-train hydra"
