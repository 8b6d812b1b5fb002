"""Output paths checked before the work that fills them: a directory files can be written
in (`check_writable`), and one writer at a time (`one_writer`: an advisory lock file, so two
runs into one place never interleave or overwrite each other)."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from spec_zoo.errors import ConfigError


def writable(path: Path) -> bool:
    """Whether files can be created in the directory ``path`` (tried, not guessed from mode
    bits, so read-only mounts and root are judged right)."""
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def check_writable(path, key: str) -> Path:
    """``path``, a directory (existing or to be made) where files can be written; else a
    one-line `ConfigError` naming ``key`` and the fix, before any work."""
    path = Path(path).expanduser()
    anchor = next(p for p in (path, *path.parents) if p.exists())
    if not anchor.is_dir():
        raise ConfigError(f"{key}: {str(path)!r} cannot be made: {anchor} is a file; give a directory path.")
    if not writable(anchor):
        raise ConfigError(f"{key}: {str(path)!r} is not writable ({anchor} is read-only); give a directory you "
                          "can write to.")
    return path


@contextmanager
def one_writer(lock_file: Path, busy: str | None = None):
    """Hold an exclusive lock on ``lock_file`` for the block. With ``busy`` (a message) a lock
    held by another process raises `ConfigError(busy)` at once; without, this one waits."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): unlocked
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy else 0))
        except BlockingIOError:
            raise ConfigError(busy) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
