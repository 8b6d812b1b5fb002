"""Held-out prompts shaped like real use (``spec-zoo-train report report.prompts=workloads``):
one category per kind of request a benchmark such as Spec-Bench asks (``report.workloads``),
each drawn from the far end of the prompts file and never a training prompt.

* **Conversations** (``follow_up: true``, MT-bench's second turns): the target answers the
  first turn itself (greedy, ``data.max_new_tokens`` tokens, as the benchmark lets it), a
  follow-up of ``report.follow_ups`` is asked, and the report scores the answer to it.
* **Long documents** (``min_tokens``): only prompts at least that long (summaries, a passage
  and a question), up to ``report.max_prompt_tokens``.
* **The request's own form** (``strip``, ``form``): the collection's sources carry their dataset's
  instruction ("Combine facts and answer this: ...", "In 2 or 3 sentences, what are the main
  points ...?"), which the target answers differently from a plain request; ``strip`` (a regex)
  removes it and ``form`` (with ``{prompt}``) puts the rest in the form real requests take
  (``Summarize: {prompt}``, a bare question). A prompt the regex does not match is left out;
  a list of regexes applies each in turn (e.g. keep only articles that end whole).
* **Its own prompts file** (``file``): a category can draw from another JSONL than
  ``data.prompts``, e.g. ``human_german.jsonl`` (data/ of a source checkout) (WMT newstest2013's German news,
  in Spec-Bench's form) for translation.
* **Never a document trained on**: a prompt is not held out when its text is a training
  prompt's, nor when it shares a run of ``report.train_ngram`` words with one (T0 asks of one
  CNN/DM article in nine templates: the held-out "2 or 3 sentences" article was trained on as a
  "TL;DR" prompt); runs that more than three training prompts share are an instruction, not a
  document, and do not count.
* **Never the benchmark's questions**: a prompt or follow-up that shares a run of
  ``report.bench_ngram`` words with any turn of ``report.bench_questions`` is dropped (the
  count is kept), on lower-cased alphanumeric words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spec_zoo.bench.dataset import DATASETS
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem, read_utf8
from spec_zoo.train.data import (
    PACKAGED_PROMPTS,
    chat_ids,
    generate_batch,
    read_records,
    second_turn_ids,
    stop_and_pad_ids,
)
from spec_zoo.train.mixture import text_digest, text_runs, trained_runs, word_ngrams


def bench_ngrams(path, n: int) -> set[tuple[str, ...]]:
    """The ``n``-word runs of every turn of a benchmark's questions (a JSONL with ``turns``;
    None: the packaged Spec-Bench)."""
    path = Path(path).expanduser() if path else DATASETS["spec_bench"]
    if not path.is_file():
        problem = file_problem(path, "a JSONL file")
        raise ConfigError(f"report.bench_questions: {problem}; give the benchmark's question.jsonl "
                          "(its prompts are kept out of the report's).")
    grams: set[tuple[str, ...]] = set()
    for line in read_utf8(path, "report.bench_questions").splitlines():
        if line.strip():
            for turn in json.loads(line)["turns"]:
                grams |= word_ngrams(turn, n)
    return grams


def refuse_bench_overlap(questions: list[str], grams: set, n: int, key: str, bench: str = "benchmark") -> None:
    """Refuse, in one line naming ``key``, a question that shares ``n`` words with a turn of
    ``bench`` (``grams``, `bench_ngrams`): the second turns the report asks and the ones training asks alike."""
    clash = [q for q in questions if word_ngrams(q, n) & grams]
    if clash:
        raise ConfigError(f"{key}: {clash[0]!r} shares {n} words with a {bench} question; write questions of "
                          "your own.")


@dataclass
class Workloads:
    """The report's prompts (token ids), the category index of each, the category names, and
    per category the prompts dropped for sharing words with the benchmark (``dropped``) or
    with a training prompt (``seen``)."""

    prompts: list[list[int]] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)

    def identity(self) -> dict:
        """What the prompt list is, for the teacher-data store's manifest."""
        digest = text_digest(",".join(map(str, p)) for p in self.prompts)
        return {"file": "report.workloads", "sha256": digest, "categories": self.names}


def workload_prompts(target, cfg, exclude: frozenset) -> Workloads:
    """The held-out prompts of ``cfg.report.workloads`` (see the module docstring)."""
    d, r = cfg.data, cfg.report
    tok = target.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ConfigError("report.prompts=workloads needs a target with a chat template (conversations are built "
                          "with it); use report.prompts=mixture for this target.")
    n = int(r.bench_ngram)
    grams = bench_ngrams(r.bench_questions, n)
    follow_ups = [str(f) for f in r.follow_ups]
    refuse_bench_overlap(follow_ups, grams, n, "report.follow_ups")
    records = read_records(d.prompts or PACKAGED_PROMPTS)
    k = int(r.get("train_ngram", 0))
    trained = trained_runs(exclude, k) if k else set()
    out = Workloads()
    for c, (name, spec) in enumerate(r.workloads.items()):
        prefixes = [str(s) for s in spec["sources"]]
        own = read_records(spec["file"], f"report.workloads.{name}.file") if spec.get("file") else records
        pool = [rec["prompt"] for rec in own if any(str(rec.get("source", "")).startswith(p) for p in prefixes)
                and rec["prompt"] not in exclude]
        pool = _in_form(pool, spec.get("strip"), spec.get("form"), name)
        order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(int(d.seed) * 1000 + c)).tolist()
        low, high = int(spec.get("min_tokens", 0)), int(r.max_prompt_tokens)
        texts: list[str] = []
        dropped = seen = 0
        for i in reversed(order):  # the far end: training takes each category's order from the front
            if len(texts) == int(r.per_category):
                break
            if word_ngrams(pool[i], n) & grams:
                dropped += 1
            elif trained and text_runs(pool[i], k) & trained:  # its document, trained on in another template
                seen += 1
            elif low <= len(chat_ids(tok, [{"role": "user", "content": pool[i]}])) <= high:
                texts.append(pool[i])
        if not texts:
            where = Path(spec.get("file") or d.prompts or PACKAGED_PROMPTS).name
            raise ConfigError(f"report.workloads.{name}: no held-out prompt of sources {prefixes} with {low}.."
                              f"{high} tokens in {where} ({seen} left out as documents trained on, {dropped} as "
                              "benchmark questions); fix its sources, min_tokens or file (a source never trained on).")
        ids = (_second_turns(target, texts, follow_ups, d, high) if spec.get("follow_up")
               else [chat_ids(tok, [{"role": "user", "content": t}]) for t in texts])
        out.prompts += ids
        out.categories += [c] * len(ids)
        out.names.append(str(name))
        out.dropped[str(name)] = dropped
        out.seen[str(name)] = seen
    return out


def _in_form(prompts: list[str], strip, form: str | None, name: str) -> list[str]:
    """``prompts`` with every match of the ``strip`` regex (or of each of a list, in order)
    removed, those a regex does not match left out, put in ``form``."""
    for rx in [strip] if isinstance(strip, str) else list(strip or []):
        try:
            pattern = re.compile(str(rx), re.DOTALL)
        except re.error as err:
            raise ConfigError(f"report.workloads.{name}.strip: {rx!r} is not a regular expression "
                              f"({err}).") from None
        prompts = [pattern.sub("", p).strip() for p in prompts if pattern.search(p)]
    if form:
        if "{prompt}" not in form:
            raise ConfigError(f"report.workloads.{name}.form: {form!r} has no {{prompt}}; "
                              "e.g. 'Summarize: {prompt}'.")
        prompts = [form.replace("{prompt}", p) for p in prompts]
    return list(dict.fromkeys(prompts))  # a source that asks of one document in several forms: it once


def _second_turns(target, texts: list[str], follow_ups: list[str], d, limit: int) -> list[list[int]]:
    """The conversation up to the second answer: turn 1, the target's own greedy answer to it
    (special tokens dropped, as the benchmark passes it back), follow-up ``i % len``."""
    tok = target.tokenizer
    first = [chat_ids(tok, [{"role": "user", "content": t}]) for t in texts]
    eos_ids, pad_id = stop_and_pad_ids(target)
    answers = generate_batch(target.model, first, int(d.max_new_tokens), 1, 0.0, eos_ids, pad_id, int(d.seed))
    out = []
    for i, text in enumerate(texts):
        p, g = len(first[i]), int(answers["gen_len"][i])
        ids = second_turn_ids(tok, text, answers["ids"][i, p : p + g].tolist(), follow_ups[i % len(follow_ups)])
        if len(ids) <= limit:
            out.append(ids)
    return out
