"""Drafting with the target's own weights at their own width (ML-SpecQD, QuantSpec).

drafter.py: `QuantizedDrafter`, the target's layers with every linear at 4 (or 8) bits on
`spec_zoo.runtime.quant_gemm`'s kernel, its own KV cache, chains, trees and exact sampling.
"""

from spec_zoo.drafters.quantized.drafter import QuantizedDrafter

__all__ = ["QuantizedDrafter"]
