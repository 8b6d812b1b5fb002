"""Acceptance rules: one module per verifier. See `spec_zoo.interfaces.Verifier`."""
