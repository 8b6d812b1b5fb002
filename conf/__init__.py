"""Hydra configs for spec-zoo; installed as the package ``spec_zoo.conf``."""
