"""The MLP speculator (IBM fms-extras; vLLM ``mlp_speculator``): a multi-stage MLP on the
target's last hidden state, each stage reading the token drafted before it.

speculator.py: the module and its artefact format; drafter.py: `MLPSpeculatorDrafter`
(decoding, chain or tree); train.py: the ``spec-zoo-train mlp_speculator`` recipe;
artefacts/: the shipped speculator.
"""

from spec_zoo.drafters.mlp_speculator.drafter import MLPSpeculatorDrafter

__all__ = ["MLPSpeculatorDrafter"]
