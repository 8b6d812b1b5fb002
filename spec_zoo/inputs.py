"""Input text files (prompts, datasets, training prompts, notes) read as UTF-8, with the line of the
first byte that is not UTF-8 in the error, so a wrongly encoded file is found at once; every read
is bounded (a device such as ``/dev/zero`` or an endless pipe would otherwise fill the memory). A
gzip file is read as the text it holds (the shipped prompt sets are stored so: a quarter of the bytes)."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

from spec_zoo.errors import ConfigError

PROMPT_BYTES = 16 * 2**20  # a prompt (file or stdin): far above what any model's context holds
TEXT_BYTES = 256 * 2**20  # a dataset, corpus or note read whole: 100x the shipped ones
GZIP_MAGIC = b"\x1f\x8b"


def file_problem(path, what: str = "a file", regular: bool = True) -> str | None:
    """Why ``path`` cannot be read as ``what`` (missing, a directory, or with ``regular`` a device
    or pipe: a file read twice, or whole), else None. A prompt may come from a pipe: its read is
    bounded (`read_utf8`)."""
    path = Path(path).expanduser()
    if path.is_dir():
        return f"{path} is a directory, not {what}"
    if not path.exists():
        return f"{path} does not exist"
    if regular and not path.is_file():
        return f"{path} is not a regular file (a device or a pipe), not {what}"
    return None


def read_utf8(path, key: str, limit: int = TEXT_BYTES) -> str:
    """The text of ``path`` (unpacked when it is gzip), at most ``limit`` bytes (more is refused:
    ``/dev/zero`` never ends); one-line `ConfigError` naming ``key`` when it is missing, a directory,
    unreadable, too long, a damaged gzip or not UTF-8."""
    path = Path(path).expanduser()
    if problem := file_problem(path, regular=False):
        raise ConfigError(f"{key}: {problem}; give a readable file.")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise ConfigError(f"{key}: cannot read {path} ({err.strerror}); give a readable file.") from None
    if data[:2] == GZIP_MAGIC:
        data = _gunzipped(data, limit, path, key)
    return _text(data, str(path), key, limit)


def _gunzipped(data: bytes, limit: int, path: Path, key: str) -> bytes:
    """The text a gzip file's bytes hold, at most ``limit`` + 1 bytes of it (a bomb stops there)."""
    unpack = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        text = unpack.decompress(data, limit + 1)
    except zlib.error as err:
        raise ConfigError(f"{key}: {path} is a damaged gzip file ({err}); copy or unpack it again.") from None
    if not unpack.eof and len(text) <= limit:
        raise ConfigError(f"{key}: {path} is a cut-off gzip file; copy or unpack it again.")
    return text


def read_stdin(key: str, limit: int = PROMPT_BYTES) -> str:
    """Standard input as text, at most ``limit`` bytes (`read_utf8`'s checks)."""
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read(limit + 1) if stream is not None else sys.stdin.read(limit + 1).encode("utf-8")
    return _text(data, "standard input", key, limit)


def _text(data: bytes, name: str, key: str, limit: int) -> str:
    if len(data) > limit:
        raise ConfigError(f"{key}: {name} holds more than {limit // 2**20} MiB, the most spec-zoo reads for it; "
                          "give a smaller file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{key}: {name} is not UTF-8 text (line {line}: byte 0x{data[err.start]:02x}, "
                          f"{err.reason}); convert it to UTF-8, e.g. iconv -f latin1 -t utf-8.") from None
