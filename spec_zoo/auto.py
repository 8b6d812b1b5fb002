"""``drafter=auto``: which drafter pays for this model on this machine, measured here rather
than read from results measured elsewhere.

When the decoder is built (`spec_zoo.api.build_decoder`), each candidate drafter decodes a few
of the user's prompts for a few tokens (`calibrate`); its speedup over plain decoding is then
priced (`price`) from what the decode stats count, tokens committed and nodes scored per step,
and what this machine's costs are: t(M) from the stored cost table (`spec_zoo.costs`, measured
first when there is none) and the drafter's own measured drafting seconds. The dearest part of a
step, scoring, comes from the table rather than the calibration's clock, so a short calibration
on a busy machine still ranks the candidates by what they do. The best one (``none``, plain
decoding, when no drafter pays) is then built exactly as if the user had named it, so auto's
output is that method's output. The choice is cached as JSON per model, machine (host ISA),
runtime and dtype (`choice_path`); ``drafter.recalibrate=true`` measures again.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from spec_zoo.costs import CONTEXTS, CostTable, cached_table, measure, table_path, what_costs
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.errors import ConfigError, first_line
from spec_zoo.outputs import atomic_write
from spec_zoo.paths import cache_root
from spec_zoo.registry import compose_option, options
from spec_zoo.runtime.cpp_kernels import host_isa
from spec_zoo.schema import fail

FORMAT = "spec-zoo-auto-choice"  # the cache file's record format (checked when read)
PLAIN = "none"  # plain decoding: always priced, at 1.0x
DEFAULT_CANDIDATES = ("ngram", "suffix", "eagle", "cascade")  # short: each one costs a calibration
QUICK_MAX_TOKENS = 32  # without a stored table, t(M) is timed up to this M (beyond, extrapolated)


class AutoChoice:
    """The settings of ``drafter=auto`` (conf/drafter/auto.yaml), checked when built, before any
    model loads: a placeholder that `spec_zoo.api.build_decoder` replaces by the drafter it
    chooses (`choose`); it never decodes itself.

    candidates:  drafter options to price (``none`` is always priced too).
    params:      per-candidate overrides keyed by option name (as the cascade's ``params``), e.g. a
                 head trained for this target: ``{eagle: {head: DIR}}``; the choice is built with them.
    prompts:     how many of the given prompts (or of ``workload``'s) the calibration decodes.
    tokens:      tokens each calibration decode generates.
    workload:    a bench workload (spec_zoo/bench/data/<name>.jsonl) to calibrate on instead of
                 the prompt(s) given; null = the prompt(s) given.
    recalibrate: measure again even when a cached choice exists.
    """

    name = "auto"

    def __init__(self, candidates: list | None = None, prompts: int = 3, tokens: int = 48,
                 workload: str | None = None, recalibrate: bool = False, params: dict | None = None):
        self.candidates = check_candidates(list(DEFAULT_CANDIDATES if candidates is None else candidates))
        # plain data (a config node's too), as the cached choice records it
        node = lambda v: dict(v) if hasattr(v, "items") else list(v)  # noqa: E731
        self.params = json.loads(json.dumps(params or {}, default=node))
        if stray := sorted(set(self.params) - set(self.candidates)):
            raise fail("drafter.params", f"names {stray[0]!r}, which is not a candidate",
                       f"key it by one of drafter.candidates ({', '.join(self.candidates)}), or add it there")
        if prompts < 1 or tokens < 2:
            raise fail("drafter.prompts" if prompts < 1 else "drafter.tokens",
                       f"{prompts if prompts < 1 else tokens} is too small",
                       "calibrate on at least 1 prompt of at least 2 tokens, e.g. drafter.prompts=3 drafter.tokens=48")
        if workload is not None and not workload_file(workload).is_file():
            names = sorted(p.stem for p in workload_file("x").parent.glob("*.jsonl"))
            raise fail("drafter.workload", f"{workload!r} is not a bench workload",
                       f"choose one of {', '.join(names)}, or null to calibrate on the prompt(s) given")
        self.prompts, self.tokens, self.workload, self.recalibrate = prompts, tokens, workload, recalibrate

    def option(self, name: str):
        """The drafter option ``name`` as ``drafter=<name>`` composes it, with this choice's params
        for it: what each candidate is calibrated as, and what the choice is built as."""
        composed = compose_option("drafter", name)
        if name not in self.params:
            return composed
        OmegaConf.set_struct(composed, False)  # params may add keys an option leaves empty (a cascade's members')
        return OmegaConf.merge(composed, self.params[name])

    def calibration_prompts(self, given: Sequence[str | list[int]]) -> list[str | list[int]]:
        """The first ``prompts`` of the workload (when named) or of ``given``."""
        if self.workload is None:
            return list(given)[: self.prompts]
        lines = workload_file(self.workload).read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["turns"][0] for line in lines if line.strip()][: self.prompts]


def workload_file(name: str) -> Path:
    """A bench workload's questions, read as data (the core imports no tool)."""
    import importlib.resources

    return Path(str(importlib.resources.files("spec_zoo"))) / "bench" / "data" / f"{name}.jsonl"


def check_candidates(candidates: list) -> list[str]:
    """``candidates``, each a lossless drafter option, else one line naming ``drafter.candidates``
    and the fix: checked before any model loads or calibration runs."""
    known = options()
    drafters = {o.name for o in known if o.group == "drafter"} - {"auto"}
    lossy = {o.name for o in known if o.group == "method" and o.lossless is False}
    fix = (f"list drafter options, e.g. drafter.candidates=[{','.join(DEFAULT_CANDIDATES)}] "
           f"(options: {', '.join(sorted(drafters))})")
    if not candidates:
        raise fail("drafter.candidates", "is empty, so there is nothing to choose from", fix)
    for name in candidates:
        if isinstance(name, str) and name in lossy:
            raise fail("drafter.candidates", f"{name!r} is a lossy method (its output is not the target's)",
                       "drafter=auto chooses among lossless drafters only: remove it")
        if not isinstance(name, str) or name not in drafters:
            raise fail("drafter.candidates", f"{name!r} is not a drafter option auto can price", fix)
    return list(dict.fromkeys(candidates))


@dataclass
class Calibration:
    """What a candidate's calibration decodes counted, the first step of each left out (it reads
    the prompt, a cost per prompt, not per step)."""

    steps: int  # target forwards
    tokens: int  # tokens committed by them
    scored: list[int]  # tokens each forward scored: the drafted nodes + 1
    draft_s: float  # seconds spent drafting
    context: int  # mean cached tokens at a step: where the cost table is read

    @property
    def tau(self) -> float:
        return self.tokens / self.steps


def price(m: Calibration, table: CostTable, step_s: float) -> tuple[float, float]:
    """(speedup over plain decoding, seconds per step) of a calibrated candidate: its tokens per
    step over its cost per step in plain steps, a step costing the table's t(M)/t(1) for the M
    tokens it scored plus its drafting seconds over ``step_s`` (one plain step now)."""
    curve = table.at(m.context)
    steps = sum(curve.relative(n) for n in m.scored) + m.draft_s / step_s
    return m.tokens / steps, steps * step_s / m.steps


def ranked(calibrations: dict[str, Calibration], table: CostTable, step_s: float) -> list[tuple[str, float, float]]:
    """(name, speedup, seconds per step) of every candidate and of plain decoding, best first;
    plain decoding wins ties (no drafter is worth it at no gain)."""
    rows = [(PLAIN, 1.0, step_s)] + [(n, *price(m, table, step_s)) for n, m in calibrations.items()]
    return sorted(rows, key=lambda r: (-r[1], r[0] != PLAIN))


def calibrate(decoder: SpeculativeDecoder, prompts: Sequence[list[int]], tokens: int) -> Calibration:
    """Decode each of ``prompts`` for ``tokens`` tokens (no EOS: a fixed length) with ``decoder``."""
    steps, scored, committed, draft_s, contexts = 0, [], 0, 0.0, []
    for ids in prompts:
        out = decoder.generate(ids, max_new_tokens=tokens, eos_token_ids=[])
        for s in out.stats.steps[1:]:
            steps += 1
            scored.append(s.drafted + 1)
            committed += s.committed
            draft_s += s.draft_s
        contexts.append(len(ids) + tokens // 2)
    if steps == 0:
        raise ConfigError(f"drafter.tokens={tokens}: the calibration took one step per prompt; give more tokens.")
    return Calibration(steps, committed, scored, draft_s, sum(contexts) // len(contexts))


def choice_path(target) -> Path:
    """Where the choice for ``target`` on this machine is cached: keyed by model, host ISA,
    runtime and dtype (and the threads, which change every cost)."""
    shape, runtime, dtype = what_costs(target)
    model = re.sub(r"[^\w.-]+", "_", str(getattr(target.config, "_name_or_path", "") or "model")).strip("_")[-60:]
    name = f"{platform.node()}-{model}-{shape}-{runtime}-{dtype}-{host_isa()}-{torch.get_num_threads()}t.json"
    return cache_root() / "auto" / name


def cached_choice(path: Path, candidates: list[str], temperature: float, params: dict | None = None) -> dict | None:
    """The cached choice at ``path`` when it was made for these candidates, their ``params`` and temperature;
    None when there is none, or it is for others (then a new calibration replaces it). A file
    that cannot be read is warned about on stderr and treated as none: never a crash."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        ok = (isinstance(record, dict) and record.get("format") == FORMAT and isinstance(record.get("line"), str)
              and isinstance(record.get("candidates"), list) and record.get("choice") in [PLAIN, *record["candidates"]])
        if not ok:
            raise ValueError("it is not a drafter=auto choice record")
    except (OSError, ValueError) as err:
        say(f"warning: drafter=auto: the cached choice {path} cannot be read ({first_line(err)}); "
            "calibrating again (it will be replaced)")
        return None
    if (record["candidates"] != candidates or record.get("temperature") != temperature
            or record.get("params", {}) != (params or {})):
        return None
    return record


def short(reason: str) -> str:
    """A refusal's gist for the one line: paths cut to their last part, up to its first full stop
    or parenthesis (the cache file keeps it whole)."""
    gist = re.sub(r"'[^']*/([^'/]+)'", r"'\1'", reason)
    return re.split(r"\. | \(|; ", gist, maxsplit=1)[0][:120]


def say(line: str) -> None:
    print(f"spec-zoo: {line}", file=sys.stderr, flush=True)


def costs_now(target, calibrations: list[Calibration]) -> tuple[CostTable, float]:
    """(the cost table to price with, seconds of one plain step now). The stored table
    (`spec-zoo costs`) when there is one, its plain step timed again now; else a short one,
    measured here for only what the calibrations scored (up to their largest M, at their mean
    context, 3 rounds: seconds, where the full table takes many minutes) and not stored."""
    table = cached_table(target)
    if table is not None:
        return table, measure(target, max_tokens=1, contexts=[table.past], repeats=5, progress=False).seconds[0]
    largest = max((max(m.scored) for m in calibrations), default=1)
    context = max((m.context for m in calibrations), default=CONTEXTS[0])
    say(f"drafter=auto: no stored cost table for this target ({table_path(target)}; `spec-zoo costs` "
        f"measures one): timing t(1..{min(largest, QUICK_MAX_TOKENS)}) at {context} cached tokens instead")
    table = measure(target, max_tokens=min(largest, QUICK_MAX_TOKENS), contexts=[context], repeats=3,
                    progress=False)
    return table, table.seconds[0]


def choose(auto: AutoChoice, target, given: Sequence[str | list[int]], encode: Callable[[str | list[int]], list[int]],
           build: Callable[[str], SpeculativeDecoder], temperature: float) -> str:
    """The drafter option to decode with: the cached choice, or a new calibration's best. ``build``
    builds the decoder of a candidate as if the user had named it; one that refuses (a model
    drafter whose trained artefact does not fit this target) is skipped, the reason said."""
    path = choice_path(target)
    record = None if auto.recalibrate else cached_choice(path, auto.candidates, temperature, auto.params)
    if record is not None:
        say(f"{record['line']} (cached in {path}; drafter.recalibrate=true measures again)")
        return record["choice"]
    prompts = [encode(p) for p in auto.calibration_prompts(given)]
    if not prompts:  # the bench gives none: its questions are what is measured
        raise fail("drafter.workload", "is null and no prompt was given to calibrate on",
                   "name a workload to calibrate on, e.g. params: {workload: repetitive}")
    calibrations, skipped = {}, {}
    for name in auto.candidates:
        if name == PLAIN:
            continue
        try:
            decoder = build(name)
        except ConfigError as err:
            skipped[name] = str(err)
            continue
        calibrations[name] = calibrate(decoder, prompts, auto.tokens)
    table, step_s = costs_now(target, list(calibrations.values()))
    rows = ranked(calibrations, table, step_s)
    best, runner = rows[0], next((r for r in rows[1:]), None)
    how = f"est. from {len(prompts)} prompt{'s' * (len(prompts) != 1)} x {auto.tokens} tokens"
    if best[0] == PLAIN:
        why = f"no candidate pays ({how}; best drafter {runner[0]} {runner[1]:.2f}x)" if runner else \
            "no candidate could be built"
        line = f"drafter=auto chose none (plain decoding): {why}"
    else:
        line = (f"drafter=auto chose {best[0]}: {best[1]:.2f}x plain ({how}: tau {calibrations[best[0]].tau:.2f}, "
                f"{best[2] * 1e3:.0f} ms/step)" + (f"; runner-up {runner[0]} {runner[1]:.2f}x" if runner else ""))
    if skipped:
        line += "; skipped " + ", ".join(f"{n} ({short(reason)})" for n, reason in skipped.items())
    say(line)
    record = {"format": FORMAT, "version": 1, "choice": best[0], "line": line, "candidates": auto.candidates,
              "params": auto.params,
              "temperature": temperature, "speedups": {r[0]: r[1] for r in rows}, "skipped": skipped,
              "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    atomic_write(path, json.dumps(record, indent=1))
    return best[0]
