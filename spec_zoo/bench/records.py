"""The results file (DESIGN.md "Benchmark results", a contract): JSON Lines, one record per
(method, prompt, turn, repeat), appended and flushed as soon as it is measured, so an
interrupted run loses at most the record being written and a rerun resumes. In a run with
``batch_size`` > 1 a record is one request of a batch: ``wall_s`` is its own latency (its
neighbours' steps included), ``batch_wall_s`` the whole batch's time and ``batch_requests``
its size, whose records are written together when it ends (a rerun measures a batch again
whole).

With ``traces=true`` the bench also appends each spec-zoo record's per-step trace to
``traces.jsonl`` beside it (`TRACE_FILE`: the record's key fields and ``steps``, one list
per quantity), written just before its record, so a resumed run never has a record whose
trace was lost; a trace written twice (interrupted before its record) is read once."""

from __future__ import annotations

import gzip
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

from spec_zoo.errors import ConfigError
from spec_zoo.outputs import read_owned_jsonl

#: the plain-decoding method every speedup and `matches_baseline` refers to
BASELINE = "ar"

#: bump when a field changes meaning or disappears (adding fields keeps the version)
SCHEMA_VERSION = 1

#: the per-step traces beside a results file (``traces=true``)
TRACE_FILE = "traces.jsonl"

#: the waves a method failed on, beside a results file (`failure_warnings`); a rerun tries them again
FAILURE_FILE = "failures.jsonl"

#: the lock file beside a results file: one spec-zoo-bench run writes into a directory at a time
LOCK_FILE = ".spec-zoo-bench.lock"

#: how each line begins, as written (a record: `FIELDS` in order; a trace or a failure: `KEY_FIELDS` first):
#: all a line cut short by an interrupted write keeps of its mark
RECORD_HEAD, KEY_HEAD = '{"schema_version": ', '{"method": '

#: what to do with a results file spec-zoo-bench did not write
NOT_OURS_FIX = "give the path of a results.jsonl spec-zoo-bench wrote"

#: the fields of a record that name it (`record_key`), which its trace repeats
KEY_FIELDS = ("method", "question_id", "turn", "repeat", "config_hash")

#: every record has exactly these fields, in this order
FIELDS = (
    "schema_version", "method", "drafter", "verifier", "lossless", "params", "model", "dataset", "category",
    "question_id", "turn", "repeat", "prompt_tokens", "new_tokens", "wall_s", "tokens_per_s",
    "target_forwards", "tau", "alpha", "drafted", "accepted", "draft_s", "verify_s",
    "accept_per_position", "predicted_speedup", "output_ids", "plain", "matches_baseline", "top2_margin_at_mismatch",
    "temperature", "seed", "max_new_tokens", "device", "platform", "machine", "threads", "torch_version",
    "spec_zoo_version", "config_hash", "dtype", "isa", "batch_size", "batch_requests", "batch_wall_s",
)


def method_label(record: dict) -> str:
    """A record's method, marked LOSSY when its verifier is (``lossless`` false: e.g.
    verifier=typical), so summaries, reports and figures never show a lossy rule unmarked."""
    return record["method"] + (" (LOSSY)" if record.get("lossless") is False else "")


def record_key(record: dict) -> tuple:
    """What makes a record unique: a rerun skips (method, question, turn, repeat) already
    measured under the same configuration."""
    return tuple(record[f] for f in KEY_FIELDS)


def unique_records(records: Iterable[dict], source="results") -> tuple[list[dict], str | None]:
    """``records`` with each `record_key` kept once (the first), and a warning saying how many
    were dropped (None: none), for the summary to show: two runs that wrote into one
    directory at once must not be averaged twice."""
    records, kept, seen = list(records), [], set()
    for r in records:
        if (key := record_key(r)) not in seen:
            seen.add(key)
            kept.append(r)
    dropped = len(records) - len(kept)
    return kept, (f"{source}: {dropped} duplicate record(s) (same method, question, turn, repeat and "
                  "config_hash) ignored; each key counts once." if dropped else None)


def read_text(path) -> str:
    """A records file's text; a name ending in ``.gz`` is read through gzip (the docs keep the
    records their scripts read compressed, e.g. ``docs/retrained/results.jsonl.gz``)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


def beside(folder, name: str) -> Path:
    """``folder/name``, or its gzipped copy ``name.gz`` where only that is kept (`read_text` reads both)."""
    path = Path(folder) / name
    gz = path.with_name(f"{name}.gz")
    return gz if not path.exists() and gz.exists() else path


def is_record(value) -> bool:
    """Whether a JSON value is a spec-zoo-bench record (its mark: a ``schema_version``)."""
    return isinstance(value, dict) and "schema_version" in value


def is_keyed(value) -> bool:
    """Whether a JSON value is a trace or a failure line (a record's `KEY_FIELDS`)."""
    return isinstance(value, dict) and all(f in value for f in KEY_FIELDS)


def read_records(path, key: str = "results", fix: str = NOT_OURS_FIX, empty_ok: bool = True,
                 warn: bool = True) -> list[dict]:
    """All records of a results file ([] when it does not exist): refused when it is not
    spec-zoo-bench's (`spec_zoo.outputs.read_owned_jsonl`: a line that is no record of its own,
    or no line at all unless ``empty_ok``). A line cut short by an interrupted write is skipped,
    said in one line on stderr (``warn``); a resumed run measures its record again. Traces and
    failures (`TRACE_FILE`, `FAILURE_FILE`) are read alike, by their file name."""
    path = Path(path)
    if not path.exists():
        return []
    keyed = path.name.removesuffix(".gz") in (TRACE_FILE, FAILURE_FILE)
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as err:
        raise ConfigError(f"{key}: {path} cannot be read as a spec-zoo-bench file ({type(err).__name__}), so it is "
                          f"left as it is; {fix}.") from None
    records, torn = read_owned_jsonl(path, KEY_HEAD if keyed else RECORD_HEAD, is_keyed if keyed else is_record, key,
                                     fix, empty_ok, text)
    if torn and warn:
        lines = ", ".join(map(str, torn))
        print(f"warning: {path} line{'s' if len(torn) > 1 else ''} {lines}: cut short by an interrupted write; "
              "ignored (a rerun into the same out= measures it again).", file=sys.stderr)
    return records


def read_traces(path) -> dict[tuple, dict]:
    """The per-step traces of a traces file by `record_key` ({} when it does not exist)."""
    return {record_key(t): t["steps"] for t in read_records(path)}


def failure_warnings(failures: Iterable[dict], records: Iterable[dict],
                     config_hashes: Iterable[str] | None = None) -> tuple[str, ...]:
    """One line per method that failed on question turns which still have no record (a rerun that
    measured them clears them): how many, in which categories, and the first error. Only the
    failures of ``config_hashes`` count where given (those of this run's methods)."""
    have = {record_key(r) for r in records}
    hashes = None if config_hashes is None else set(config_hashes)
    by_method: dict[str, dict[tuple, dict]] = {}
    for f in failures:
        if record_key(f) not in have and (hashes is None or f["config_hash"] in hashes):
            by_method.setdefault(f["method"], {})[record_key(f)] = f
    lines = []
    for method, failed in by_method.items():
        categories: dict[str, int] = {}
        for f in failed.values():
            categories[f["category"]] = categories.get(f["category"], 0) + 1
        first = next(iter(failed.values()))
        lines.append(f"method {method} failed on {len(failed)} question turn(s) "
                     f"({', '.join(f'{c} {n}' for c, n in categories.items())}), which have no record and are "
                     f"left out of its figures (and of its later turns); first: {first['error']}. Tracebacks "
                     f"in {FAILURE_FILE}; a rerun into the same out= tries them again.")
    return tuple(lines)


_NUMBER, _INT = (int, float), (int,)

#: the type of each field a summary or report reads: (types, required); a required field must be
#: present and not null, another may be missing or null; numbers must be finite and not negative
FIELD_TYPES = {
    "method": ((str,), True), "category": ((str,), True), "question_id": ((int, str), True),
    "turn": (_INT, True), "repeat": (_INT, True), "config_hash": ((str,), True),
    "new_tokens": (_INT, True), "wall_s": (_NUMBER, True),
    "prompt_tokens": (_INT, False), "tokens_per_s": (_NUMBER, False), "output_ids": ((list,), False),
    "temperature": (_NUMBER, False), "max_new_tokens": (_INT, False), "target_forwards": (_INT, False),
    "tau": (_NUMBER, False), "alpha": (_NUMBER, False), "drafted": (_INT, False), "accepted": (_INT, False),
    "draft_s": (_NUMBER, False), "verify_s": (_NUMBER, False), "accept_per_position": ((list,), False),
    "predicted_speedup": (_NUMBER, False), "plain": ((str,), False), "matches_baseline": ((bool,), False),
    "top2_margin_at_mismatch": (_NUMBER, False), "lossless": ((bool,), False), "params": ((dict,), False),
    "batch_size": (_INT, False), "batch_requests": (_INT, False), "batch_wall_s": (_NUMBER, False),
}


def record_problem(record: dict) -> str | None:
    """What makes ``record`` unreadable by a summary (a missing field, a wrong type, a
    non-finite or negative number), or None."""
    for field, (types, required) in FIELD_TYPES.items():
        value = record.get(field)
        if value is None:
            if required:
                return f"has no {field}" if field not in record else f"has {field}=null"
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"has {field}={value!r:.40}, not {' or '.join(t.__name__ for t in types)}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"has {field}={value}, not a finite number"
        negative = isinstance(value, (int, float)) and value < 0
        if types in (_NUMBER, _INT) and negative and field != "top2_margin_at_mismatch":
            return f"has {field}={value}, a negative number"
    return None


def check_schema(records: Iterable[dict], source="results") -> list[dict]:
    """``records`` as a list, after checking each carries this version's ``schema_version`` and
    readable fields (`record_problem`); any other record raises `ConfigError` naming the file,
    the record and the fix (nothing is rewritten: the file stays as it is). A torn last line
    is not a record: `read_records` skips it with a warning, and a resumed run measures it again."""
    records = list(records)
    for i, r in enumerate(records):
        version = r.get("schema_version") if isinstance(r, dict) else None
        if not is_record(r):
            raise ConfigError(f"{source}: record {i + 1} has no schema_version: it was not written by spec-zoo-bench; "
                              f"{NOT_OURS_FIX} (the file is left as it is).")
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"{source}: record {i + 1} has schema_version={version!r}, this spec-zoo reads "
                f"schema_version={SCHEMA_VERSION}; summarize/report it with the spec-zoo version that wrote it, "
                "or rerun the benchmark into a new out= directory (the file is left as it is)."
            )
        if problem := record_problem(r):
            raise ConfigError(f"{source}: record {i + 1} {problem}; it was not written by spec-zoo-bench: fix or "
                              "remove that line, or rerun the benchmark into a new out= directory (the file is left "
                              "as it is).")
    return records


class RecordWriter:
    """Appends records to a results file, one flushed line each; the file is made (or opened) with
    the first record, so a run stopped before one leaves no empty file (which no rerun would take
    for spec-zoo's: `read_records`)."""

    def __init__(self, path):
        self.path = Path(path)
        self.file = None

    def write(self, record: dict) -> None:
        if self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            size = self.path.stat().st_size if self.path.exists() else 0
            cut_short = size and not self.path.read_bytes().endswith(b"\n")
            self.file = self.path.open("a", encoding="utf-8")
            if cut_short:  # keep a partial last line from gluing onto the next record
                self.file.write("\n")
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
