"""Every path spec-zoo writes goes through here, so one set of rules serves every writer.

A path is judged and written as the file system will reach it (`resolved`: ``~``, symlinks and
``..`` applied first; ``A/nosuch/../../B`` is ``B`` once ``A/nosuch`` exists, so judging the
path as typed let a writer replace a directory it never checked). Then: a directory files can be
written in (`check_writable`); a file replaced only when spec-zoo wrote it (`check_replaceable`:
its `SIGNATURE`, or a JSON ``format`` naming spec-zoo), never the user's; every persistent
file written whole or not at all (`atomic_write`: a temp file beside it, then one rename); and
one writer at a time (`one_writer`: an advisory lock file, so two runs into one place never
interleave or overwrite each other; for a file in the user's place the lock lives in spec-zoo's
cache, `lock_path`, never beside it). A JSONL spec-zoo appends to is its own only when every
line says so (`read_owned_jsonl`: each record begins with its mark), so a user's file is never
taken for an empty results file."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from spec_zoo.errors import ConfigError
from spec_zoo.paths import cache_root

#: what marks a file spec-zoo wrote (a markdown comment on its first line, a PNG's text chunk),
#: so a later run replaces its own file and refuses the user's
SIGNATURE = "written by spec-zoo"


def resolved(path) -> Path:
    """``path`` as writing it will reach it: ``~`` expanded, symlinks followed and ``..`` applied
    after them, the missing tail normalised (`os.path.realpath`, not strict). Judge this one and
    write this one: the path as typed can name another place once its missing parts are made."""
    return Path(os.path.realpath(Path(path).expanduser()))


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
    one-line `ConfigError` naming ``key`` and the fix, before any work. Returns it `resolved`."""
    path = resolved(path)
    anchor = next(p for p in (path, *path.parents) if p.exists())
    if not anchor.is_dir():
        raise ConfigError(f"{key}: {str(path)!r} cannot be made: {anchor} is a file; give a directory path.")
    if not writable(anchor):
        raise ConfigError(f"{key}: {str(path)!r} is not writable ({anchor} is read-only); give a directory you "
                          "can write to.")
    return path


def signed_markdown(text: str, tool: str) -> str:
    """``text`` with a first line saying spec-zoo's ``tool`` wrote it (an HTML comment, hidden
    when rendered): what lets the next run replace it, and only it (`written_by_spec_zoo`)."""
    return f"<!-- {SIGNATURE} ({tool}); running it again replaces this file -->\n{text}"


def written_by_spec_zoo(path: Path) -> bool:
    """Whether spec-zoo wrote the file ``path``: `SIGNATURE` near its top (markdown, figures),
    or, for JSON, an object whose ``format`` names spec-zoo (its records and tables)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
        if SIGNATURE.encode() in head:
            return True
        if path.suffix != ".json":
            return False
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and str(value.get("format", "")).startswith("spec-zoo-")


def check_replaceable(path, key: str, fix: str, overwrite: bool = False) -> Path:
    """``path`` `resolved`, if a file may be written there: new (in a directory that is or can
    be made writable), or one spec-zoo wrote (with ``overwrite``, any file). Else a one-line
    `ConfigError` naming ``key``, the path and ``fix`` (e.g. "give -o a new path, or pass
    --overwrite"). Called before the work, and again by the writer."""
    path = resolved(path)
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a directory, not a file; {fix}.")
    check_writable(path.parent, key)
    if path.exists() and not overwrite and not written_by_spec_zoo(path):
        raise ConfigError(f"{key}: {path} exists and was not written by spec-zoo, so it is not replaced; {fix}.")
    return path


def check_outputs(out_dir, names, key: str, fix: str) -> Path:
    """``out_dir`` `resolved`, once each file ``names`` a command writes there may be written
    (`check_replaceable`): called before the work, so a refusal costs nothing."""
    out_dir = check_writable(out_dir, key)
    for name in names:
        check_replaceable(out_dir / name, key, fix)
    return out_dir


def umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path, content: str | bytes | Callable[[Path], object]) -> Path:
    """Write the file ``path`` (`resolved`) whole or not at all: ``content`` (text, bytes, or a
    function that writes the path it is given: safetensors, torch.save, savefig) goes to a temp
    file beside it, which then replaces ``path`` in one rename. An interrupted write leaves
    the previous file; the new one gets the modes of any file under the user's umask."""
    path = resolved(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(content, str):
                f.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                f.write(content)
        if callable(content):
            content(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save_figure(fig, path, dpi: int) -> Path:
    """A matplotlib figure as a PNG at ``path``, atomically, carrying `SIGNATURE` (a text chunk)
    so a later run may replace it and no picture of the user's. Its colours go to a 256-entry
    palette (`palette_png`): a third of the bytes, for the figures a report keeps in the tree."""
    def write(tmp: Path) -> None:
        drawn = io.BytesIO()
        fig.savefig(drawn, dpi=dpi, format="png")
        drawn.seek(0)
        palette_png(drawn, tmp, {"Software": SIGNATURE})

    return atomic_write(path, write)


def palette_png(source, path, text: dict[str, str]) -> None:
    """The PNG ``source`` (a path or a binary file) written to ``path`` with at most 256 colours,
    undithered, and ``text`` as its text chunks. A plot is a few flat colours and their
    anti-aliased edges, so the picture looks the same (the tree carries 155 figures; issue 60)."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    with Image.open(source) as image:
        image.load()
    rgba = image.convert("RGBA")
    opaque = rgba.getchannel("A").getextrema()[0] == 255
    colours = (rgba.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
               if opaque else rgba.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE))
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    colours.save(path, format="PNG", optimize=True, pnginfo=info)


def write_owned(path, text: str, key: str, fix: str, overwrite: bool = False) -> Path:
    """`atomic_write` ``text`` to ``path`` once `check_replaceable` allows it: how spec-zoo
    writes a file into a place the user chose (reports, summaries). ``text`` should carry
    the mark of `signed_markdown` (or be JSON with a spec-zoo ``format``), so a later run
    may replace it."""
    return atomic_write(check_replaceable(path, key, fix, overwrite), text)


def lock_path(path) -> Path:
    """The lock file of the file ``path`` (`resolved`) spec-zoo writes in a place the user chose:
    in spec-zoo's cache (``locks/``), named by the path's hash, so no ``<file>.lock`` is left
    beside the user's files and every process writing ``path`` finds the same lock."""
    import hashlib

    name = hashlib.sha256(str(resolved(path)).encode()).hexdigest()[:24]
    return cache_root() / "locks" / f"{name}.lock"


def read_owned_jsonl(path, head: str, ours: Callable[[object], bool], key: str, fix: str, empty_ok: bool = False,
                     text: str | None = None) -> tuple[list, list[int]]:
    """The records of the JSONL ``path`` (its ``text`` when given) spec-zoo appends to, and the
    numbers of its lines an interrupted write cut short (a rerun redoes them). Each record spec-zoo
    writes carries its mark (``ours`` says whether a JSON value does) and begins with ``head`` (e.g.
    ``{"format": "spec-zoo-batch-results"``: all a cut line keeps). Any other line (a note,
    another tool's JSON), or no line at all (unless ``empty_ok``), means the file is not spec-zoo's:
    a one-line `ConfigError` naming ``key``, the line and ``fix``, before any work."""
    path = Path(path)
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{key}: {path} cannot be read as a spec-zoo results file ({type(err).__name__}), so "
                              f"it is left as it is; {fix}.") from None
    values, torn = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
            if line.startswith(head) or head.startswith(line):  # a record cut short
                torn.append(number)
                continue
        if value is None or not ours(value):
            raise ConfigError(f"{key}: {path} was not written by spec-zoo (line {number}, {line.strip()[:40]!r}, is "
                              f"not one of its records), so it is left as it is; {fix}.")
        values.append(value)
    if not values and not torn and not empty_ok:
        raise ConfigError(f"{key}: {path} exists and is empty; spec-zoo never leaves its results file empty, so it "
                          f"is not spec-zoo's and is left as it is; {fix}.")
    return values, torn


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
