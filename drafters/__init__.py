"""Drafters: one module per drafter family. See `spec_zoo.interfaces.Drafter`."""
