"""Writes spec_zoo/bench/data/repetitive.jsonl: the repetitive-workload track, generated here
from small word lists (no third-party text), so it ships under spec-zoo's own licence.

Two kinds of requests whose outputs repeat *across* requests, where drafting from earlier
outputs pays (SuffixDecoding's agentic workloads):
- extraction (ids 1001-1024): one JSON schema, one instruction, many short documents;
- editing (ids 2001-2006): an agent editing one small Python file over three turns, each
  turn asking for the whole file back.

    python docs/suffix/make_repetitive.py   # rewrites the file (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "spec_zoo" / "bench" / "data" / "repetitive.jsonl"
FIRST = ["Maria", "James", "Aiko", "Lucas", "Fatima", "Oliver", "Chen", "Sofia", "Noah", "Amara", "Ivan", "Lena"]
LAST = ["Lopez", "Smith", "Tanaka", "Martin", "Haddad", "Brown", "Wei", "Rossi", "Miller", "Okafor", "Petrov", "Weber"]
CITIES = ["Lyon", "Denver", "Osaka", "Porto", "Cairo", "Leeds", "Chengdu", "Turin", "Austin", "Lagos", "Kazan", "Graz"]
JOBS = ["nurse", "carpenter", "teacher", "chemist", "pilot", "baker", "architect", "librarian", "plumber", "dentist"]
TEMPLATES = [
    "{name} is a {age}-year-old {job} living in {city}. You can reach {them} at {email}.",
    "Born {age} years ago, {name} now works as a {job} in {city} (contact: {email}).",
    "Our new member, {name}, {age}, moved to {city} last spring and is a {job}. Email: {email}.",
    "Contact card -- {name}; occupation: {job}; based in {city}; age {age}; {email}",
]
INSTRUCTION = ("Extract the person's details from the text below as JSON with exactly these keys: "
               "\"name\", \"age\", \"city\", \"occupation\", \"email\". Reply with the JSON object only.\n\nText: ")
FILES = [
    ("f", "items",
     "def f(items):\n    t = 0\n    for x in items:\n        t = t + x[\"price\"] * x[\"qty\"]\n    return t\n"),
    ("g", "words",
     "def g(words):\n    n = 0\n    for w in words:\n        if len(w) > 3:\n            n = n + 1\n    return n\n"),
    ("h", "rows", "def h(rows):\n    out = []\n    for r in rows:\n        out.append(r[0])\n    return out\n"),
    ("k", "values",
     "def k(values):\n    m = values[0]\n    for v in values:\n        if v > m:\n            m = v\n    return m\n"),
    ("p", "text",
     "def p(text):\n    s = \"\"\n    for c in text:\n        if c.isalpha():\n            s = s + c\n    return s\n"),
    ("q", "pairs", "def q(pairs):\n    d = {}\n    for a, b in pairs:\n        d[a] = b\n    return d\n"),
]
NEW_NAMES = ["total_price", "count_long_words", "first_column", "largest", "letters_only", "to_dict"]


def extraction(rng: random.Random) -> list[dict]:
    records = []
    for i in range(24):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        text = rng.choice(TEMPLATES).format(
            name=f"{first} {last}", age=rng.randint(21, 68), city=rng.choice(CITIES), job=rng.choice(JOBS),
            them="them", email=f"{first.lower()}.{last.lower()}@example.org")
        records.append({"question_id": 1001 + i, "category": "extraction", "turns": [INSTRUCTION + text]})
    return records


def editing() -> list[dict]:
    records = []
    for i, ((old, arg, code), new) in enumerate(zip(FILES, NEW_NAMES)):
        turns = [
            f"Here is a Python file:\n\n```python\n{code}```\n\nRename the function `{old}` to `{new}`. "
            "Reply with the whole file in one ```python block.",
            f"Now add a one-line docstring to `{new}`. Reply with the whole file in one ```python block.",
            f"Now add type hints to the parameter `{arg}` and the return value. "
            "Reply with the whole file in one ```python block.",
        ]
        records.append({"question_id": 2001 + i, "category": "editing", "turns": turns})
    return records


def main() -> None:
    records = extraction(random.Random(26)) + editing()
    OUT.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
