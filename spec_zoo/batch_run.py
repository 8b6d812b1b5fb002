"""``spec-zoo prompts_file=FILE [batch_size=N] [out=RESULTS.jsonl]``: many requests through the one loop.

The prompts are decoded ``batch_size`` at a time with continuous batching
(`SpeculativeDecoder.generate_batch`): each request's output is exactly the one it gets alone.
Each finished request is printed and, with ``out``, appended to a JSONL at once (flushed and
synced), so an interrupted run loses nothing: the same command again skips the requests ``out``
already holds and decodes the rest. ``out`` is refused before any model loads when it is not a
results file of these prompts, and one run writes it at a time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from omegaconf import DictConfig

from spec_zoo.decoder import Output, SpeculativeDecoder
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import read_utf8
from spec_zoo.outputs import check_writable, one_writer, resolved

FORMAT = "spec-zoo-batch-results"  # every line of an ``out`` file carries it: how a rerun knows the file is ours
FIX = "give out= another path (a rerun with the same prompts_file resumes its own results file)"


def read_prompts(path) -> list[str | list[int]]:
    """The requests of ``prompts_file``: a ``.jsonl`` of one prompt per line (a JSON string, a list of
    token ids, or an object whose ``prompt`` is either), or any other text file with one prompt per
    line; blank lines are skipped. A bad line is an error naming its line number and the fix."""
    text = read_utf8(path, "prompts_file")
    prompts: list[str | list[int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if Path(path).suffix != ".jsonl":
            prompts.append(line)
            continue
        where = f"prompts_file: {path} line {number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where} is not JSON ({err.msg}); write one JSON prompt per line, e.g. "
                              '{"prompt": "Tell me about bees"}.') from None
        value = value.get("prompt") if isinstance(value, dict) else value
        ids = isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        if not (isinstance(value, str) or ids) or not value or (isinstance(value, str) and not value.strip()):
            raise ConfigError(f"{where}: {line.strip()[:60]!r} holds no prompt; give a non-empty string or list "
                              'of token ids, alone or as {"prompt": ...}.')
        prompts.append(value)
    if not prompts:
        raise ConfigError(f"prompts_file: {path} holds no prompt; put one prompt per line in it.")
    return prompts


def done_requests(out, prompts: list) -> dict[int, dict]:
    """The results ``out`` already holds, by request index (none when it does not exist); refused
    when it is not spec-zoo's results file of these prompts. A line cut short by an interrupted
    write is dropped: that request runs again."""
    path = results_path(out)
    if not path.exists():
        return {}
    done: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # an interrupted write: measured again
        if not isinstance(row, dict) or row.get("format") != FORMAT:
            raise ConfigError(f"out: {path} is not a spec-zoo batch results file; {FIX}.")
        i = row.get("index")
        if not isinstance(i, int) or not 0 <= i < len(prompts) or row.get("prompt") != prompts[i]:
            raise ConfigError(f"out: {path} holds results of other prompts than prompts_file's (request {i}); {FIX}.")
        done[i] = row
    return done


def results_path(out) -> Path:
    """``out`` `resolved`, a file that can be appended to (new, in a writable directory, or one this
    command wrote: `done_requests` reads it line by line, the only way to know it for a JSONL)."""
    path = resolved(out)
    if path.is_dir():
        raise ConfigError(f"out: {path} is a directory, not a file; {FIX}.")
    check_writable(path.parent, "out")
    return path


def result_row(index: int, prompt, out: Output) -> dict:
    """One request's line in ``out``."""
    s = out.stats
    return {"format": FORMAT, "index": index, "prompt": prompt, "text": out.text, "ids": out.ids,
            "finish_reason": out.finish_reason, "new_tokens": s.new_tokens, "wall_s": s.wall_s, "tau": s.tau,
            "alpha": s.alpha, "target_forwards": s.target_forwards}


def run_batch(cfg: DictConfig, decoder: SpeculativeDecoder, prompts: list, say: Callable[[str], None] = print,
              ) -> tuple[list[Output], float]:
    """Decode the ``prompts`` not yet in ``cfg.out``, ``cfg.batch_size`` at a time, printing (and
    appending) each as it finishes; then one line for the whole run. Returns the outputs and the
    run's seconds."""
    gen = cfg.generation
    done = done_requests(cfg.out, prompts) if cfg.out else {}
    todo = [i for i in range(len(prompts)) if i not in done]
    if done:
        say(f"out: {len(done)} of {len(prompts)} requests already in {cfg.out}; decoding the other {len(todo)}")
    ids = [decoder.encode(prompts[i], chat=gen.chat) for i in todo]  # every prompt checked before decoding
    slots = decoder.slots(cfg.batch_size)
    with ExitStack() as held:
        sink = None
        if cfg.out:
            path = results_path(cfg.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(one_writer(path.with_name(path.name + ".lock"), busy=(
                f"out: {path} is being written by another spec-zoo run; wait for it, or {FIX}.")))
            sink = held.enter_context(open(path, "a", encoding="utf-8"))
            if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
                sink.write("\n")  # after a line cut short by an interruption: never append to it

        def finished(k: int, out: Output) -> None:
            i = todo[k]
            say(f"--- request {i}: {out.stats.summary()}\n{out.text if out.text is not None else out.ids}")
            if sink is not None:
                sink.write(json.dumps(result_row(i, prompts[i], out)) + "\n")
                sink.flush()
                os.fsync(sink.fileno())

        start = time.perf_counter()
        outputs = decoder.generate_batch(ids, gen.max_new_tokens, gen.stop_strings, batch_size=cfg.batch_size,
                                         request_ids=todo, on_done=finished)
        wall = time.perf_counter() - start
    tokens = sum(len(o.ids) for o in outputs)
    drafting = "drafted together" if decoder.drafter.drafts_together else "each drafting on its own"
    how = f"{slots} at a time, {drafting}" if slots > 1 else "one after another (" + (
        "the target holds one cache" if not decoder.target.holds_many else "the drafter keeps one state") + ")"
    say(f"{len(outputs)} requests, {tokens} tokens in {wall:.2f} s: {tokens / wall if wall else 0:.1f} tok/s over "
        f"the run, batch_size={cfg.batch_size}, decoded {how}")
    return outputs, wall
