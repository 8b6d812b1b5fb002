"""Benchmark prompts: Spec-Bench questions, grouped and subsampled the way the benchmark reports them.

Spec-Bench stores MT-bench questions (ids 81-160) under MT-bench's own eight
sub-categories; Spec-Bench itself reports them as one category, ``mt_bench``, and so
do we. Subsampling is deterministic (a hash of the question id), so a small run
covers MT-bench's sub-categories evenly rather than only its first one, and a larger
``per_category`` keeps every question of a smaller one (so results resume and extend).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem, read_utf8

#: datasets shipped with spec-zoo: name -> JSONL file (see data/SOURCE.md for origin and licence);
#: repetitive is the cross-request reuse track (docs/suffix.md); continuation is plain text for a base
#: model (model=gemma3_270m), which Spec-Bench's chat turns do not fit
DATASETS = {"spec_bench": Path(__file__).parent / "data" / "question.jsonl.gz",  # gzip, read as text
            "repetitive": Path(__file__).parent / "data" / "repetitive.jsonl",
            "continuation": Path(__file__).parent / "data" / "continuation.jsonl"}
MT_BENCH_IDS = range(81, 161)
#: report order of Spec-Bench's categories
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Question:
    """One benchmark prompt; ``turns`` are user messages, each asked after the model's previous answer."""

    question_id: int
    category: str
    turns: tuple[str, ...]


def category_of(record: dict) -> str:
    """Spec-Bench's reporting category: MT-bench questions collapse into ``mt_bench``."""
    return "mt_bench" if record["question_id"] in MT_BENCH_IDS else record["category"]


def _order_key(question_id: int) -> str:
    return hashlib.sha256(str(question_id).encode()).hexdigest()


def subsample(questions: Sequence[Question], per_category: int | None) -> list[Question]:
    """The first ``per_category`` questions of each category in a fixed hashed order,
    returned sorted by question id; None keeps everything."""
    if per_category is None:
        return sorted(questions, key=lambda q: q.question_id)
    if per_category < 1:
        raise ConfigError(f"dataset.per_category={per_category}; use a positive integer or null for all questions.")
    kept: list[Question] = []
    for category in dict.fromkeys(q.category for q in questions):
        members = sorted((q for q in questions if q.category == category), key=lambda q: _order_key(q.question_id))
        kept += members[:per_category]
    return sorted(kept, key=lambda q: q.question_id)


def load_questions(
    name: str = "spec_bench",
    path: str | Path | None = None,
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
    prompt_field: str = "turns",
    category_field: str | None = "category",
    id_field: str | None = "question_id",
) -> list[Question]:
    """Read a JSONL of prompts (``path``, or the shipped dataset ``name``), keep the
    requested ``categories`` and subsample; raise `ConfigError` when nothing is left.

    ``name="jsonl"`` reads any JSONL (bring your own prompts): ``prompt_field`` holds a
    prompt (a string) or a conversation's user turns (a list of strings),
    ``category_field`` the category (None: every prompt is in category ``all``) and
    ``id_field`` a numeric id (None: the line number). Spec-Bench's MT-bench grouping
    applies only to the shipped format (``name`` other than ``jsonl``).
    """
    where = "dataset.path"
    if name == "jsonl":
        if path is None:
            raise ConfigError("dataset=jsonl needs dataset.path=FILE (a JSONL with one prompt per line, "
                              "the prompt in dataset.prompt_field).")
    elif path is None:
        if name not in DATASETS:
            raise ConfigError(
                f"dataset.name={name!r} is unknown; available: {', '.join([*DATASETS, 'jsonl'])} "
                "(dataset=jsonl dataset.path=FILE dataset.prompt_field=NAME benchmarks your own prompts)."
            )
        path, where = DATASETS[name], f"dataset {name}"
    file = Path(path)
    if problem := file_problem(file, "a JSONL file"):
        raise ConfigError(f"{where}: {problem}; point it at a JSONL file of prompts.")
    spec_bench_format = name != "jsonl"
    questions = []
    text = read_utf8(file, "dataset.path" if where == "dataset.path" else "dataset.name")
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            if prompt_field not in record:
                raise KeyError(prompt_field)
            turns = record[prompt_field]
            turns = (turns,) if isinstance(turns, str) else tuple(turns)
            if not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{prompt_field} must be a string or a non-empty list of strings")
            qid = int(record[id_field]) if id_field else line_no
            category = str(record[category_field]) if category_field else "all"
            if spec_bench_format:
                category = category_of({"question_id": qid, "category": category})
            questions.append(Question(qid, category, turns))
        except (ValueError, KeyError, TypeError) as err:
            fields = f"dataset.prompt_field={prompt_field}" + (f", dataset.id_field={id_field}" if id_field else "") + (
                f", dataset.category_field={category_field}" if category_field else "")
            raise ConfigError(f"{file}:{line_no} is not a prompt record (missing or bad {err}); "
                              f"each line needs the fields {fields} (set those keys to your file's names).") from err
    ids = [q.question_id for q in questions]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{file}: question ids repeat; set dataset.id_field to a unique numeric field "
                          "(or null to number prompts by line).")
    if categories is not None:
        known = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ConfigError(f"dataset.categories: {name} has no {unknown}; choose from {', '.join(known)}.")
        questions = [q for q in questions if q.category in categories]
    questions = subsample(questions, per_category)
    if not questions:
        raise ConfigError(
            f"dataset {name} ({file}) has no questions to run; check dataset.path and dataset.categories."
        )
    return questions


def load_dataset(cfg) -> list[Question]:
    """`load_questions` from a ``dataset`` config node (conf/dataset/*.yaml)."""
    get = cfg.get
    return load_questions(get("name", "spec_bench"), get("path"), get("per_category"), get("categories"),
                          get("prompt_field", "turns"), get("category_field", "category"),
                          get("id_field", "question_id"))


def prompt_encoder(decoder, chat: bool = True):
    """``encode(turns, answers) -> ids`` for the runner: the conversation so far (user turns
    with the method's own earlier answers in between), through the target's chat template
    via ``decoder.encode_chat`` when ``chat`` is set, else as plain text."""
    tokenizer = decoder.target.tokenizer

    def encode(turns, answers):
        replies = [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
        if chat and getattr(tokenizer, "chat_template", None):
            messages = []
            for turn, reply in zip(turns, replies + [None]):
                messages.append({"role": "user", "content": turn})
                if reply is not None:
                    messages.append({"role": "assistant", "content": reply})
            return decoder.encode_chat(messages)
        text = "\n\n".join(t for pair in zip(turns, replies + [""]) for t in pair if t)
        return decoder.encode(text, chat=False)

    return encode
