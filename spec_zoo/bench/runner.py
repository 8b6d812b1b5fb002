"""The benchmark loop: interleaved methods, resumable records, baseline comparison.

For each question and repeat, each turn is run by every method in turn (baseline first),
so slow drift of the machine (thermal, other load) hits all methods alike. A method's
second turn is asked after its *own* first answer. The loop sees prompts only as token
ids, through ``encode(turns, answers)``: the dataset/chat layer stays outside (and tests
can feed token ids to a tiny model without a tokenizer).
"""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

import spec_zoo
from spec_zoo.bench.dataset import Question
from spec_zoo.bench.methods import Method
from spec_zoo.bench.records import (
    BASELINE,
    FAILURE_FILE,
    FIELDS,
    KEY_FIELDS,
    SCHEMA_VERSION,
    RecordWriter,
    check_schema,
    read_records,
    record_key,
)
from spec_zoo.runtime.cpp_kernels import host_isa
from spec_zoo.runtime.target import Target

#: (user turns so far, this method's answers to the earlier ones) -> prompt token ids
Encode = Callable[[Sequence, list[list[int]]], list[int]]


def run_context(model: str, dataset: str, temperature: float, device) -> dict:
    """The fields every record of a run shares, including the software versions."""
    return {
        "model": model, "dataset": dataset, "temperature": temperature, "device": str(device),
        "torch_version": torch.__version__, "spec_zoo_version": spec_zoo.__version__,
        "platform": platform.platform(), "machine": machine(), "isa": host_isa(), "threads": torch.get_num_threads(),
    }


def machine() -> str:
    """Host name, CPU model, core count and ISA (`host_isa`; plus the GPU name on CUDA): where timings were taken."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    text = f"{platform.node()} | {cpu} x{os.cpu_count()} | {host_isa()}"
    if torch.cuda.is_available():
        text += f" | {torch.cuda.get_device_name()}"
    return text


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two outputs differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def top2_margin(target: Target, prefix: list[int]) -> float:
    """Top-1 minus top-2 logit of the target after ``prefix``: a small margin explains a
    greedy mismatch as a near-tie broken differently by different kernels/batch shapes."""
    ids = torch.tensor([prefix], device=target.device)
    top = target.model(input_ids=ids, use_cache=False).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def run_benchmark(
    methods: Sequence[Method],
    questions: Sequence[Question],
    encode: Encode,
    results_path,
    *,
    target: Target,
    context: dict,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    greedy: bool = True,
    warmup_tokens: int = 8,
    on_record: Callable[[dict], None] | None = None,
    progress: bool = True,
    traces_path=None,
    batch_size: int = 1,
) -> list[dict]:
    """Measure every method on every question turn, ``repeats`` times; return the records
    of this configuration (those found in ``results_path`` plus the new ones).

    ``methods[0]`` must be the baseline (``ar``). ``context`` holds the shared fields
    (see `run_context`). ``on_record`` sees each new record after it is written.
    ``traces_path``: append each new record's per-step trace there (`records.TRACE_FILE`).
    ``batch_size``: the questions go in groups of this many, and each method decodes a group's
    turn as one batch of requests (`Method.run_batch`): per group, repeat and turn every method
    runs in turn, so drift hits all alike, as it does one question at a time (batch size 1).
    A group's records are written when it ends; a rerun measures again only groups not complete.
    A method other than the baseline that raises on a wave (a peer engine's bug, a plugin's) does
    not stop the run: the error goes to stderr and, with its traceback, to `FAILURE_FILE` beside
    the results; those questions get no record from it (nor their later turns), and a rerun tries
    them again. The baseline's errors stop the run: nothing can be compared without it.
    """
    if not methods or methods[0].name != BASELINE:
        raise ValueError(f"methods[0] must be the baseline {BASELINE!r}")
    names = [m.name for m in methods]
    if late := next((m for i, m in enumerate(methods) if i and m.plain not in names[:i]), None):
        raise ValueError(f"method {late.name}: its plain method {late.plain!r} must run before it")
    if repeats < 1 or batch_size < 1:
        raise ValueError(f"repeats={repeats}, batch_size={batch_size}; both must be positive integers")
    done = {record_key(r): r for r in check_schema(read_records(results_path), str(results_path))}
    groups = [questions[i:i + batch_size] for i in range(0, len(questions), batch_size)]
    # run order: group of questions, repeat, turn, then every method (baseline first)
    plan = [(group, r, t, m) for group in groups for r in range(repeats)
            for t in range(1, max(len(q.turns) for q in group) + 1) for m in methods]
    if any(_key(q, r, t, m) not in done for group, r, t, m in plan for q in group if t <= len(q.turns)):
        # warm-up: first-call costs (allocations, kernel selection) stay out of the timings
        prompts = [encode(q.turns[:1], []) for q in groups[0]]
        ids = [q.question_id for q in groups[0]]
        for method in methods:  # what it writes stays hidden from that question (drafter=suffix)
            try:
                method.run_batch(prompts, min(warmup_tokens, max_new_tokens), seed, ids, batch_size)
            except Exception as err:
                if method is methods[0]:
                    raise
                print(f"spec-zoo-bench: method {method.name} failed its warm-up: {_error(err)}", file=sys.stderr)

    records = []
    answers: dict[tuple[str, Hashable], list[list[int]]] = {}  # each method's own answers to each question
    failed: set[tuple[str, Hashable]] = set()  # (method, question) whose turn failed this run
    failures = _FailureLog(Path(results_path).with_name(FAILURE_FILE))
    with (RecordWriter(results_path) as writer, RecordWriter(traces_path) if traces_path else nullcontext() as traces,
          tqdm(total=sum(len(g) for g, *_ in plan), desc="bench", disable=not progress) as bar, failures):
        for group, repeat, turn, method in plan:
            if turn == 1:
                for q in group:
                    answers[method.name, q.question_id] = []
                    failed.discard((method.name, q.question_id))
            wave = [q for q in group if turn <= len(q.turns) and (method.name, q.question_id) not in failed]
            found = [done.get(_key(q, repeat, turn, method)) for q in wave]
            wave_records = [r for r in found if r is not None]
            if len(wave_records) < len(wave):
                more = f"+{len(wave) - 1}" if len(wave) > 1 else ""
                bar.set_postfix_str(f"{method.name} q{wave[0].question_id}{more} t{turn}")
                try:
                    measured = _measure_wave(method, methods[0], wave, repeat, turn, encode, answers,
                                             max_new_tokens, seed + repeat, target, greedy, batch_size, context)
                except Exception as err:
                    if method is methods[0]:
                        raise
                    failures.write(err, [{**dict(zip(KEY_FIELDS, _key(q, repeat, turn, method))),
                                          "category": q.category} for q in wave])
                    failed.update((method.name, q.question_id) for q in wave)
                    tqdm.write(f"spec-zoo-bench: method {method.name} failed on question(s) "
                               f"{', '.join(str(q.question_id) for q in wave)} turn {turn} repeat {repeat}: "
                               f"{_error(err)}", file=sys.stderr)
                    bar.update(len(group))
                    continue
                for record, trace in measured:
                    if traces is not None and trace is not None:  # before its record: a resume re-measures both
                        traces.write({**{f: record[f] for f in KEY_FIELDS}, "steps": trace})
                    writer.write(record)
                    if on_record:
                        on_record(record)
                wave_records = [record for record, _ in measured]
            for q, record in zip(wave, wave_records, strict=True):
                answers[method.name, q.question_id].append(record["output_ids"])
                records.append(record)
            bar.update(len(group))
    return records


def _error(err: BaseException) -> str:
    """An exception as one line: its type and message."""
    return f"{type(err).__name__}: {err}".splitlines()[0]


class _FailureLog:
    """`FAILURE_FILE`: one line per question a method failed on, with the error and its traceback;
    created at the first failure, appended to by reruns."""

    def __init__(self, path: Path):
        self.path = path
        self.writer: RecordWriter | None = None

    def write(self, err: BaseException, keys: list[dict]) -> None:
        self.writer = self.writer or RecordWriter(self.path)
        for key in keys:
            self.writer.write({**key, "error": _error(err), "traceback": traceback.format_exc(),
                               "time": time.strftime("%Y-%m-%dT%H:%M:%S")})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.writer:
            self.writer.close()


def _key(question: Question, repeat: int, turn: int, method: Method) -> tuple:
    """The `record_key` of the record this step of the plan writes."""
    return method.name, question.question_id, turn, repeat, method.config_hash


def _lossless(method: Method) -> bool | None:
    """Whether the method's verifier is exact (None: not a spec-zoo decoder, e.g. transformers)."""
    decoder = getattr(method, "decoder", None)
    return None if decoder is None else bool(decoder.verifier.lossless)


def _measure_wave(method: Method, baseline: Method, wave: Sequence[Question], repeat: int, turn: int,
                  encode: Encode, answers: dict, max_new_tokens: int, seed: int, target: Target, greedy: bool,
                  batch_size: int, context: dict) -> list[tuple[dict, dict | None]]:
    """Run ``method`` on this turn of every question of ``wave`` as one batch; return each
    question's record and per-step trace (None: not a spec-zoo decoder, or decoded in a batch)."""
    mine = [answers[method.name, q.question_id] for q in wave]
    prompts = [encode(q.turns[:turn], own) for q, own in zip(wave, mine, strict=True)]
    # drafters that learn across requests (drafter=suffix) hide what this question's earlier runs
    # produced: a repeat must not draft its own answer
    start = time.perf_counter()
    measured = method.run_batch(prompts, max_new_tokens, seed, [q.question_id for q in wave], batch_size)
    wave_s = time.perf_counter() - start
    out = []
    for q, prompt, own, m in zip(wave, prompts, mine, measured, strict=True):
        base = answers[method.plain, q.question_id]
        # comparable to its plain method only on the same prompt: the same earlier answers
        # (and only where its plain method answered this turn: a peer plain method may have failed)
        comparable = greedy and (method is baseline or len(base) >= turn) and own == base[: turn - 1]
        baseline_ids = m.output_ids if method is baseline else base[turn - 1] if comparable else []
        matches = m.output_ids == baseline_ids if comparable else None
        margin = None
        if matches is False:
            at = first_difference(m.output_ids, baseline_ids)
            if at is not None and at < len(baseline_ids):
                margin = top2_margin(target, prompt + baseline_ids[:at])
        values = {
            **m.fields, "schema_version": SCHEMA_VERSION, "method": method.name, "drafter": method.drafter,
            "verifier": method.verifier, "lossless": _lossless(method), "params": method.params,
            "output_ids": m.output_ids, "plain": method.plain, "matches_baseline": matches,
            "top2_margin_at_mismatch": margin, "seed": seed, "max_new_tokens": max_new_tokens,
            "config_hash": method.config_hash, "dtype": method.dtype, "batch_size": batch_size,
            "batch_requests": len(wave), "batch_wall_s": wave_s,
            **context, "category": q.category, "question_id": q.question_id, "turn": turn, "repeat": repeat,
        }
        out.append(({f: values[f] for f in FIELDS}, m.trace))
    return out
