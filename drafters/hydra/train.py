"""``spec-zoo-train hydra``: train Hydra heads (`spec_zoo.drafters.hydra.heads.HydraHeads`) for
a frozen target, on the shared teacher-data store, each head teacher-forced on the tokens the
target wrote before its own (`spec_zoo.train.staged`: the loss, held-out metrics and report it
shares with the MLP speculator)."""

from __future__ import annotations

from spec_zoo.drafters.hydra.heads import HydraHeads
from spec_zoo.schema import NON_NEGATIVE, POSITIVE, Keys, Limit
from spec_zoo.train.methods import register
from spec_zoo.train.staged import StagedRecipe


@register("hydra")
class HydraRecipe(StagedRecipe):
    """What `spec-zoo-train hydra` trains: `HydraHeads` (section ``heads``)."""

    desc, drafter, section, size_key = "hydra heads", "hydra", "heads", "num_heads"
    head_class = HydraHeads
    artefact = HydraHeads.RECORD, HydraHeads.FORMAT
    keys = Keys(limits={"heads.num_heads": POSITIVE, "heads.vocab_size": NON_NEGATIVE,
                        "heads.decay": Limit(low=0, low_open=True, high=1, example="0.8")})
