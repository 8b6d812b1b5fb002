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

#: datasets shipped with spec-zoo: name -> JSONL file (see data/SOURCE.md for origin and licence)
DATASETS = {"spec_bench": Path(__file__).parent / "data" / "question.jsonl"}
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
    path: str | None = None,
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
) -> list[Question]:
    """Read a Spec-Bench-format JSONL (``path``, or the shipped dataset ``name``), keep the
    requested ``categories`` and subsample; raise `ConfigError` when nothing is left."""
    if path is None:
        if name not in DATASETS:
            raise ConfigError(
                f"dataset.name={name!r} is unknown; available: {', '.join(DATASETS)} "
                "(or set dataset.path to a JSONL file of {question_id, category, turns} records)."
            )
        path = DATASETS[name]
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"dataset.path={path} does not exist; point it at a JSONL file of questions.")
    questions = []
    for line_no, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            question = Question(int(record["question_id"]), category_of(record), tuple(record["turns"]))
            if not question.turns:
                raise ValueError("no turns")
            questions.append(question)
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"{file}:{line_no} is not a question record ({err}); each line needs question_id, category, turns."
            ) from err
    if categories is not None:
        known = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ConfigError(f"dataset.categories has unknown {unknown}; {name} has: {', '.join(known)}.")
        questions = [q for q in questions if q.category in categories]
    questions = subsample(questions, per_category)
    if not questions:
        raise ConfigError(
            f"dataset {name} ({file}) has no questions to run; check dataset.path and dataset.categories."
        )
    return questions


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
