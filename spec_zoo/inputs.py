"""Input text files (datasets, training prompts, notes) read as UTF-8, with the line of the
first byte that is not UTF-8 in the error, so a wrongly encoded file is found at once."""

from __future__ import annotations

from pathlib import Path

from spec_zoo.errors import ConfigError


def read_utf8(path, key: str) -> str:
    """The text of ``path``; one-line `ConfigError` naming ``key`` when it is unreadable or not UTF-8."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{key}: cannot read {path} ({err.strerror}); give a readable file.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{key}: {path} is not UTF-8 text (line {line}: byte 0x{data[err.start]:02x}, "
                          f"{err.reason}); convert it to UTF-8, e.g. iconv -f latin1 -t utf-8.") from None
