"""Errors spec-zoo raises for bad input: each message names the key and the fix."""


class ConfigError(ValueError):
    """A configuration or input value that cannot work; raised before expensive work."""


def first_line(err: BaseException) -> str:
    """``Type: first line of the message``: how a foreign exception is quoted in a one-line error."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
