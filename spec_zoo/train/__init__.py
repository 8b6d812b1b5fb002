"""Training of draft models: ``spec-zoo-train distill`` (see docs/distill.md)."""
