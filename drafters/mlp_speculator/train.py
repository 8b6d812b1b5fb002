"""``spec-zoo-train mlp_speculator``: train the MLP speculator
(`spec_zoo.drafters.mlp_speculator.speculator.MLPSpeculator`) for a frozen target, on the
shared teacher-data store, its stages teacher-forced on the tokens the target wrote
(`spec_zoo.train.staged`: the loss, held-out metrics and report it shares with Hydra)."""

from __future__ import annotations

from spec_zoo.drafters.mlp_speculator.speculator import MLPSpeculator
from spec_zoo.schema import NON_NEGATIVE, POSITIVE, Keys, Limit
from spec_zoo.train.methods import register
from spec_zoo.train.staged import StagedRecipe


@register("mlp_speculator")
class MLPSpeculatorRecipe(StagedRecipe):
    """What `spec-zoo-train mlp_speculator` trains: an `MLPSpeculator` (section ``speculator``)."""

    desc, drafter, section, size_key = "mlp speculator", "mlp_speculator", "speculator", "num_stages"
    head_class = MLPSpeculator
    artefact = MLPSpeculator.RECORD, MLPSpeculator.FORMAT
    keys = Keys(limits={"speculator.num_stages": POSITIVE, "speculator.vocab_size": NON_NEGATIVE,
                        "speculator.decay": Limit(low=0, low_open=True, high=1, example="0.8")})
