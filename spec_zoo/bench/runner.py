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
from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext

import torch
from tqdm.auto import tqdm

import spec_zoo
from spec_zoo.bench.dataset import Question
from spec_zoo.bench.methods import Method
from spec_zoo.bench.records import (
    BASELINE,
    FIELDS,
    KEY_FIELDS,
    SCHEMA_VERSION,
    RecordWriter,
    check_schema,
    read_records,
    record_key,
)
from spec_zoo.cpp_kernels import host_isa
from spec_zoo.target import Target

#: (user turns so far, this method's answers to the earlier ones) -> prompt token ids
Encode = Callable[[Sequence, list[list[int]]], list[int]]


def run_context(model: str, dataset: str, temperature: float, device) -> dict:
    """The fields every record of a run shares, including the software versions."""
    return {
        "model": model, "dataset": dataset, "temperature": temperature, "device": str(device),
        "torch_version": torch.__version__, "spec_zoo_version": spec_zoo.__version__,
        "platform": platform.platform(), "machine": machine(), "threads": torch.get_num_threads(),
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
) -> list[dict]:
    """Measure every method on every question turn, ``repeats`` times; return the records
    of this configuration (those found in ``results_path`` plus the new ones).

    ``methods[0]`` must be the baseline (``ar``). ``context`` holds the shared fields
    (see `run_context`). ``on_record`` sees each new record after it is written.
    ``traces_path``: append each new record's per-step trace there (`records.TRACE_FILE`).
    """
    if not methods or methods[0].name != BASELINE:
        raise ValueError(f"methods[0] must be the baseline {BASELINE!r}")
    names = [m.name for m in methods]
    if late := next((m for i, m in enumerate(methods) if i and m.plain not in names[:i]), None):
        raise ValueError(f"method {late.name}: its plain method {late.plain!r} must run before it")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}; it must be a positive integer")
    done = {record_key(r): r for r in check_schema(read_records(results_path), str(results_path))}
    # run order: question, repeat, turn, then every method (baseline first)
    plan = [(q, r, t, m) for q in questions for r in range(repeats)
            for t in range(1, len(q.turns) + 1) for m in methods]
    if any(_key(*step) not in done for step in plan):
        # warm-up: first-call costs (allocations, kernel selection) stay out of the timings
        prompt = encode(questions[0].turns[:1], [])
        for method in methods:  # what it writes stays hidden from that question (drafter=suffix)
            method.run(prompt, min(warmup_tokens, max_new_tokens), seed, questions[0].question_id)

    records = []
    with (RecordWriter(results_path) as writer, RecordWriter(traces_path) if traces_path else nullcontext() as traces,
          tqdm(total=len(plan), desc="bench", disable=not progress) as bar):
        for question, repeat, turn, method in plan:
            if turn == 1 and method is methods[0]:
                answers: dict[str, list[list[int]]] = {m.name: [] for m in methods}  # each method's own answers
            record = done.get(_key(question, repeat, turn, method))
            if record is None:
                bar.set_postfix_str(f"{method.name} q{question.question_id} t{turn}")
                mine, base = answers[method.name], answers[method.plain]
                prompt = encode(question.turns[:turn], mine)
                # comparable to its plain method only on the same prompt: the same earlier answers
                comparable = greedy and mine == base[: turn - 1]
                # drafters that learn across requests (drafter=suffix) hide what this question's
                # earlier runs produced: a repeat must not draft its own answer
                values, trace = _measure(method, prompt, max_new_tokens, seed + repeat, target,
                                         base[turn - 1] if method is not methods[0] else None, comparable,
                                         question.question_id)
                values.update(context, category=question.category, question_id=question.question_id,
                              turn=turn, repeat=repeat)
                record = {f: values[f] for f in FIELDS}
                if traces is not None and trace is not None:  # before its record: a resume re-measures both
                    traces.write({**{f: record[f] for f in KEY_FIELDS}, "steps": trace})
                writer.write(record)
                if on_record:
                    on_record(record)
            answers[method.name].append(record["output_ids"])
            records.append(record)
            bar.update()
    return records


def _key(question: Question, repeat: int, turn: int, method: Method) -> tuple:
    """The `record_key` of the record this step of the plan writes."""
    return method.name, question.question_id, turn, repeat, method.config_hash


def _lossless(method: Method) -> bool | None:
    """Whether the method's verifier is exact (None: not a spec-zoo decoder, e.g. transformers)."""
    decoder = getattr(method, "decoder", None)
    return None if decoder is None else bool(decoder.verifier.lossless)


def _measure(method: Method, prompt: list[int], max_new_tokens: int, seed: int, target: Target,
             baseline_ids: list[int] | None, comparable: bool,
             request_id: Hashable | None = None) -> tuple[dict, dict | None]:
    """Run ``method`` once; return its record's method and measurement fields, and its
    per-step trace (None: not a spec-zoo decoder). ``baseline_ids``: the output of its plain
    method (`Method.plain`) on this prompt, None when ``method`` is the baseline itself."""
    measured = method.run(prompt, max_new_tokens, seed, request_id)
    if baseline_ids is None:
        baseline_ids = measured.output_ids
    matches = measured.output_ids == baseline_ids if comparable else None
    margin = None
    if matches is False:
        at = first_difference(measured.output_ids, baseline_ids)
        if at is not None and at < len(baseline_ids):
            margin = top2_margin(target, prompt + baseline_ids[:at])
    return {
        **measured.fields, "schema_version": SCHEMA_VERSION, "method": method.name, "drafter": method.drafter,
        "verifier": method.verifier, "lossless": _lossless(method), "params": method.params,
        "output_ids": measured.output_ids, "plain": method.plain,
        "matches_baseline": matches, "top2_margin_at_mismatch": margin, "seed": seed,
        "max_new_tokens": max_new_tokens, "config_hash": method.config_hash,
    }, measured.trace
