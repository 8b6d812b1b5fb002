"""spec-zoo: speculative decoding as drafter x verifier strategies around one loop."""

__version__ = "0.1.0"

from spec_zoo.api import generate
from spec_zoo.decoder import Output, SpeculativeDecoder
from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict, Verifier
from spec_zoo.sampling import SamplingParams, logits_to_probs
from spec_zoo.target import Target

__all__ = [
    "ConfigError",
    "DecodeState",
    "Draft",
    "Drafter",
    "Output",
    "SamplingParams",
    "SpeculativeDecoder",
    "Target",
    "Verdict",
    "Verifier",
    "generate",
    "logits_to_probs",
]
