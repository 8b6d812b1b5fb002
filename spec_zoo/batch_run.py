"""``spec-zoo prompts_file=FILE [batch_size=N] [out=RESULTS.jsonl]``: many requests through the one loop.

The prompts are decoded ``batch_size`` at a time with continuous batching
(`SpeculativeDecoder.generate_batch`): each request's output is exactly the one it gets alone.
Each finished request is printed and, with ``out``, appended to a JSONL at once (flushed and
synced), so an interrupted run loses nothing: the same command again skips the requests ``out``
already holds and decodes the rest. ``out`` is refused before any model loads when it is not a
results file of these prompts made with these settings (every line carries spec-zoo's mark and
the settings that change an output, `run_settings`), and one run writes it at a time (its lock in
spec-zoo's cache, `spec_zoo.outputs.lock_path`). The file is made with the first result: a run
refused or stopped before one leaves nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from spec_zoo import console
from spec_zoo.decoder import Output, SpeculativeDecoder
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import read_utf8
from spec_zoo.outputs import check_writable, lock_path, one_writer, read_owned_jsonl, resolved

FORMAT = "spec-zoo-batch-results"  # every line of an ``out`` file carries it: how a rerun knows the file is ours
HEAD = f'{{"format": "{FORMAT}"'  # how each line begins (`result_row` puts the format first)
FIX = "give out= another path (a rerun with the same prompts_file resumes its own results file)"
#: the config sections that change an output, recorded in every line and compared on resume
SETTINGS = ("model", "drafter", "verifier", "generation", "seed")


class Prompts(list):
    """The prompts of a ``prompts_file``, with the file's line of each (``lines``), so an error about
    a prompt found later (one the tokenizer refuses, one too long for the cache) names its line."""

    def __init__(self, path, prompts=(), lines=()):
        super().__init__(prompts)
        self.path, self.lines = path, list(lines)

    def where(self, index: int) -> str:
        """``prompts_file: PATH line N`` of request ``index``."""
        return f"prompts_file: {self.path} line {self.lines[index]}"


def read_prompts(path) -> Prompts:
    """The requests of ``prompts_file``: a ``.jsonl`` of one prompt per line (a JSON string, a list of
    token ids, or an object whose ``prompt`` is either), or any other text file with one prompt per
    line; blank lines are skipped. A bad line is an error naming its line number and the fix."""
    text = read_utf8(path, "prompts_file")
    prompts = Prompts(path)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        prompts.lines.append(number)
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


def run_settings(cfg: DictConfig) -> dict:
    """The settings of ``cfg`` that change an output (`SETTINGS`), as plain values: what each line
    of ``out`` records, so a resume never puts results of other settings beside them."""
    return {k: OmegaConf.to_container(cfg[k], resolve=True) if isinstance(cfg[k], DictConfig) else cfg[k]
            for k in SETTINGS}


def _flat(value, prefix: str = "") -> dict:
    """``value`` as dotted keys (``generation.max_new_tokens``), in order."""
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}" if prefix else key).items()}


def settings_difference(theirs, ours: dict) -> str | None:
    """The first setting of ``ours`` whose value ``theirs`` (a line's) does not share, said as
    ``key=there, key=now``; None when they agree."""
    if not isinstance(theirs, dict):
        return "no settings recorded (an older spec-zoo wrote it)"
    mine, recorded = _flat(ours), _flat(theirs)
    for key in [*mine, *(k for k in recorded if k not in mine)]:
        if mine.get(key, "(unset)") != recorded.get(key, "(unset)"):
            return f"{key}={recorded.get(key, '(unset)')!r} there, {key}={mine.get(key, '(unset)')!r} now"
    return None


def done_requests(out, prompts: list, settings: dict) -> dict[int, dict]:
    """The results ``out`` already holds, by request index (none when it does not exist); refused
    when it is not spec-zoo's results file (`read_owned_jsonl`) of these prompts made with these
    ``settings`` (`run_settings`). A line cut short by an interrupted write is dropped: that
    request runs again."""
    path = results_path(out)
    if not path.exists():
        return {}
    done: dict[int, dict] = {}
    rows, _ = read_owned_jsonl(path, HEAD, lambda row: isinstance(row, dict) and row.get("format") == FORMAT, "out",
                               FIX)
    for row in rows:
        i = row.get("index")
        if not isinstance(i, int) or not 0 <= i < len(prompts) or row.get("prompt") != prompts[i]:
            raise ConfigError(f"out: {path} holds results of other prompts than prompts_file's (request {i}); {FIX}.")
        if differs := settings_difference(row.get("settings"), settings):
            raise ConfigError(f"out: {path} holds results made with other settings ({differs}); rerun with the "
                              f"file's settings to resume it, or {FIX}.")
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


def cut_note(out: Output) -> str:
    """What a summary line adds when the target's context ended the output (finish_reason "cache")."""
    return " | cut short: the target's context is full (finish_reason cache)" if out.finish_reason == "cache" else ""


def encode_request(decoder: SpeculativeDecoder, prompts: list, index: int, chat: bool) -> list[int]:
    """Request ``index`` as token ids; a prompt the target refuses is named by its line of the file."""
    try:
        return decoder.encode(prompts[index], chat=chat)
    except ConfigError as err:
        if not isinstance(prompts, Prompts):
            raise
        raise ConfigError(f"{prompts.where(index)}: {err}") from None


def result_row(index: int, prompt, out: Output, settings: dict) -> dict:
    """One request's line in ``out`` (its `FORMAT` first: the mark `done_requests` reads)."""
    s = out.stats
    return {"format": FORMAT, "index": index, "prompt": prompt, "text": out.text, "ids": out.ids,
            "finish_reason": out.finish_reason, "new_tokens": s.new_tokens, "wall_s": s.wall_s, "tau": s.tau,
            "alpha": s.alpha, "target_forwards": s.target_forwards, "settings": settings}


def run_batch(cfg: DictConfig, decoder: SpeculativeDecoder, prompts: list, say: Callable[[str], None] = print,
              ) -> tuple[list[Output], float]:
    """Decode the ``prompts`` not yet in ``cfg.out``, ``cfg.batch_size`` at a time, printing (and
    appending) each as it finishes; then one line for the whole run. Returns the outputs and the
    run's seconds."""
    gen = cfg.generation
    settings = run_settings(cfg)
    with ExitStack() as held:
        done: dict[int, dict] = {}
        if cfg.out:
            path = results_path(cfg.out)
            held.enter_context(one_writer(lock_path(path), busy=(
                f"out: {path} is being written by another spec-zoo run; wait for it, or {FIX}.")))
            done = done_requests(path, prompts, settings)  # again, now that no other run can write it
        todo = [i for i in range(len(prompts)) if i not in done]
        if done:
            say(f"out: {len(done)} of {len(prompts)} requests already in {cfg.out}; decoding the other {len(todo)}")
        ids = [encode_request(decoder, prompts, i, gen.chat) for i in todo]  # every prompt checked before decoding
        slots = decoder.slots(cfg.batch_size)
        sink = None
        written = len(done)
        if cfg.out:
            console.keep(f"nothing new was written to {path}; rerun the same command to resume")

        def finished(k: int, out: Output) -> None:
            nonlocal sink, written
            i = todo[k]
            text = out.text if out.text is not None else out.ids
            say(f"--- request {i}: {out.stats.summary()}{cut_note(out)}\n{text}")
            if not cfg.out:
                return
            if sink is None:  # made with the first result: a run stopped before one leaves no empty file
                path.parent.mkdir(parents=True, exist_ok=True)
                cut_short = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
                sink = held.enter_context(open(path, "a", encoding="utf-8"))
                if cut_short:
                    sink.write("\n")  # after a line cut short by an interruption: never append to it
            sink.write(json.dumps(result_row(i, prompts[i], out, settings)) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            written += 1
            console.keep(f"{written} of {len(prompts)} results are kept in {path}; rerun the same command to "
                         "decode the rest")

        start = time.perf_counter()
        outputs = decoder.generate_batch(ids, gen.max_new_tokens, gen.stop_strings, batch_size=cfg.batch_size,
                                         request_ids=todo, on_done=finished)
        wall = time.perf_counter() - start
    console.keep("the results are written; nothing is left to resume")
    tokens = sum(len(o.ids) for o in outputs)
    drafting = "drafted together" if decoder.drafter.drafts_together else "each drafting on its own"
    how = f"{slots} at a time, {drafting}" if slots > 1 else "one after another (" + (
        "the target holds one cache" if not decoder.target.holds_many else "the drafter keeps one state") + ")"
    say(f"{len(outputs)} requests, {tokens} tokens in {wall:.2f} s: {tokens / wall if wall else 0:.1f} tok/s over "
        f"the run, batch_size={cfg.batch_size}, decoded {how}")
    return outputs, wall
