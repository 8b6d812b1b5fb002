"""Errors spec-zoo raises for bad input: each message names the key and the fix."""


class ConfigError(ValueError):
    """A configuration or input value that cannot work; raised before expensive work."""
