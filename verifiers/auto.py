"""``verifier=auto``, the default: greedy matching at temperature 0, exact speculative
sampling (rejection) above. The one place that choice is made; the CLI, the API, the bench
and `SpeculativeDecoder` (through `spec_zoo.registry.build_option`) all take it from here."""

from __future__ import annotations

from spec_zoo.interfaces import Verifier
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier


def auto_verifier(temperature: float) -> Verifier:
    """Greedy at ``temperature`` 0, rejection above; marked ``auto`` so summaries can say it was chosen."""
    verifier = GreedyVerifier() if temperature == 0 else RejectionVerifier()
    verifier.auto = True
    return verifier


# both choices are (what `spec-zoo list` reports); mypy does not model attributes set on a function
auto_verifier.lossless = True  # type: ignore[attr-defined]
