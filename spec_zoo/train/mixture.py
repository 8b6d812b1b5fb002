"""The prompt mixture: which task categories the teacher data covers, in what proportions.

A draft agrees with the target only on the kind of text it was trained on, so the
training prompts are drawn per category (chat, code, math, ...; each a list of ``source``
prefixes of the prompts file) in configured shares. The order is *prefix-stable*: the
first N prompts of a mixture are the same for every N and already hold the shares, so a
store filled for 1,024 prompts is a prefix of the one for 2,048 (`spec_zoo.train.store`).

A category with ``follow_up: true`` holds conversations, as MT-bench's second turns: each of
its prompts is followed by a `FollowUp`, the same conversation one turn on (the target's own
answer, then a question of ``data.follow_ups``), so the store trains on both answers.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem
from spec_zoo.train.data import PACKAGED_PROMPTS, encode_prompts, prompts_path, read_records

_WORD = re.compile(r"[a-z0-9]+")  # a word, as prompts are compared: lower-cased alphanumeric


def word_ngrams(text: str, n: int, stride: int = 1) -> set[tuple[str, ...]]:
    """The runs of ``n`` lower-cased alphanumeric words of ``text`` (one starting every ``stride`` words)."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(0, len(words) - n + 1, stride)}


def trained_runs(texts, n: int, stride: int = 8, common: int = 3) -> set[int]:
    """Hashes of the ``n``-word runs (lower-cased alphanumeric words) of ``texts`` that start
    every ``stride`` words, less those in more than ``common`` texts (an instruction many prompts
    share is not their content). A text sharing ``n + stride - 1`` consecutive words with one of
    ``texts`` holds one of them (`text_runs`): its document was trained on, maybe in another template."""
    seen: dict[int, int] = {}
    for text in texts:
        for h in map(hash, word_ngrams(text, n, stride)):  # hashes: a store's texts hold millions of runs
            seen[h] = seen.get(h, 0) + 1
    return {h for h, k in seen.items() if k <= common}


def text_runs(text: str, n: int) -> set[int]:
    """Hashes of every ``n``-word run of ``text``, to meet `trained_runs`."""
    return set(map(hash, word_ngrams(text, n)))


@dataclass(frozen=True)
class FollowUp:
    """The second turn of the conversation whose first turn is the prompt before it: that
    turn's text and the question asked after the target's own answer. Its token ids exist only
    once the answer does (`spec_zoo.train.store`)."""

    first: str
    question: str


def categories(d) -> dict[str, dict]:
    """``{name: {"share", "sources", "follow_up"}}`` of ``data.mixture``; with
    ``data.use_mixture=false``, a single category ``all`` made of ``data.sources`` (every record
    when null)."""
    mixture = d.mixture if d.get("use_mixture", True) else None
    if not mixture:
        return {"all": {"share": 1.0, "sources": list(d.get("sources") or []), "follow_up": False}}
    if d.get("sources"):
        raise ConfigError("data.sources is set but data.use_mixture=true, whose categories name their sources: "
                          "set data.sources=null, or data.use_mixture=false to filter one seeded order of prompts.")
    out: dict[str, dict] = {}
    for name, c in mixture.items():
        share = float(c["share"])
        if share < 0:
            raise ConfigError(f"data.mixture.{name}.share={share}; a share must be >= 0.")
        if share > 0:
            out[str(name)] = {"share": share, "sources": [str(s) for s in c["sources"]],
                              "follow_up": bool(c.get("follow_up", False)),
                              **({"file": str(c["file"])} if c.get("file") else {})}
    if not out:
        raise ConfigError("data.mixture has no category with a share > 0.")
    talks = [k for k, c in out.items() if c["follow_up"]]
    if talks and not (d.get("chat", True) and list(d.get("follow_ups") or [])):
        raise ConfigError(f"data.mixture.{talks[0]}.follow_up=true needs data.chat=true and data.follow_ups (the "
                          "second-turn questions, conf/train_distill.yaml); set them, or follow_up=false.")
    total = sum(c["share"] for c in out.values())
    return {k: {**c, "share": round(c["share"] / total, 6)} for k, c in out.items()}


def file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def text_digest(texts) -> str:
    return hashlib.sha256("\n\0".join(sorted(texts)).encode()).hexdigest()[:16]


def describe(d, cats: dict) -> dict:
    """What fixes the prompt list (the store's identity, besides the target): file, categories, encoding."""
    if d.get("token_ids") is not None:
        digest = hashlib.sha256(repr([list(map(int, p)) for p in d.token_ids]).encode()).hexdigest()[:16]
        return {"file": "data.token_ids", "sha256": digest, "categories": [["token_ids", 1.0, []]]}
    path = Path(d.prompts or PACKAGED_PROMPTS).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.prompts: {file_problem(path, 'a JSONL file')}; "
                          "give a JSONL file with a `prompt` field per line.")
    talks = any(c.get("follow_up") for c in cats.values())  # absent otherwise: older stores keep their identity
    return {"file": path.name, "sha256": file_digest(path),
            "categories": [[k, c["share"], c["sources"], *(["follow_up"] if c.get("follow_up") else []),
                            *([f"file {file_digest(prompts_path(c['file']))}"] if c.get("file") else [])]
                           for k, c in cats.items()],
            **({"follow_ups": [str(q) for q in d.follow_ups]} if talks else {}),
            "chat": bool(d.chat),
            "max_prompt_tokens": int(d.max_prompt_tokens), "seed": int(d.seed)}


def mixture_prompts(tokenizer, d, cats: dict, num: int, heldout: frozenset | None = None,
                    heldout_ngram: int = 0) -> tuple[list[list[int] | FollowUp], list[int], dict[str, int]]:
    """The first ``num`` prompts of the mixture: (token ids, or a `FollowUp` after a
    conversation's first turn; category index per prompt; prompts taken per category). Each
    category's records come in a seeded order and are encoded lazily (prompts over
    ``data.max_prompt_tokens`` are skipped); the next prompt is taken from the category
    furthest below its share; an exhausted category drops out. ``heldout``: evaluation
    prompts instead, from the far end of each category's order and never one of these texts
    (the prompts a draft was trained on) nor a text sharing ``heldout_ngram`` + 7 words with one
    (the same document in another template, `trained_runs`)."""
    ids, cat_of, taken, _ = _draw(tokenizer, d, cats, num, heldout, heldout_ngram)
    return ids, cat_of, taken


def mixture_texts(tokenizer, d, cats: dict, num: int) -> list[str]:
    """The texts of the first ``num`` prompts of the mixture: what a recipe with
    ``data.num_prompts=num`` and these data settings trained on."""
    return _draw(tokenizer, d, cats, num, None)[3]


def _draw(tokenizer, d, cats: dict, num: int, heldout: frozenset | None, heldout_ngram: int = 0):
    """`mixture_prompts` and the texts it encoded."""
    trained = trained_runs(heldout, heldout_ngram) if heldout and heldout_ngram else set()
    path = Path(d.prompts or PACKAGED_PROMPTS).expanduser()
    records = read_records(path)
    names = list(cats)
    pools = []
    for c, name in enumerate(names):
        prefixes = cats[name]["sources"]
        own = read_records(cats[name]["file"], f"data.mixture.{name}.file") if cats[name].get("file") else records
        pool = [r["prompt"] for r in own
                if (not prefixes or any(str(r.get("source", "")).startswith(p) for p in prefixes))
                and not (heldout and r["prompt"] in heldout)]
        if not pool:
            raise ConfigError(f"data.mixture: category {name!r} matches no record of "
                              f"{Path(cats[name].get('file') or path).name} "
                              f"(sources {prefixes}); fix its sources or set its share to 0.")
        order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(int(d.seed) * 1000 + c)).tolist()
        pools.append([pool[i] for i in (order[::-1] if heldout is not None else order)])
    questions = [str(q) for q in d.get("follow_ups") or []]
    cursor, taken = [0] * len(names), [0] * len(names)
    prompts: list[list[int] | FollowUp] = []
    cat_of: list[int] = []
    texts: list[str] = []
    live = set(range(len(names)))
    while len(prompts) < num and live:
        n = len(prompts) + 1
        c = max(sorted(live), key=lambda j: cats[names[j]]["share"] * n - taken[j])
        ids = None
        while ids is None and cursor[c] < len(pools[c]):
            text = pools[c][cursor[c]]
            cursor[c] += 1
            if trained and text_runs(text, heldout_ngram) & trained:
                continue
            enc = encode_prompts(tokenizer, [text], bool(d.chat), int(d.max_prompt_tokens))
            ids = enc[0] if enc else None
        if ids is None:
            live.discard(c)
            continue
        turns: list[list[int] | FollowUp] = [ids]
        if cats[names[c]].get("follow_up"):  # the pair stays together: the second turn is built from the first
            turns.append(FollowUp(text, questions[(taken[c] // 2) % len(questions)]))
        for turn in turns:
            prompts.append(turn)
            texts.append(text)
            cat_of.append(c)
            taken[c] += 1
    if len(prompts) > num and isinstance(prompts[num], FollowUp):
        num -= 1  # never a first turn without its second: a longer run's shard would start at a second turn
    del prompts[num:], texts[num:], cat_of[num:]
    return prompts, cat_of, {names[c]: cat_of.count(c) for c in range(len(names))}, texts
