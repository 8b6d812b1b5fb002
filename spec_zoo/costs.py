"""The measured scoring-cost table t(M): what one target forward costs for M scored tokens.

Draft lengths and tree sizes are worth choosing only against what scoring really costs on
the machine at hand, and that curve is stepwise (compiled on a CPU: flat up to 4 tokens,
then a jump; a GPU: flat to dozens), which no straight-line fit expresses. The table is
measured once per machine, model shape, runtime, dtype and thread count, cached as JSON
under ``$SPEC_ZOO_CACHE/costs/`` (`table_path`) and re-measured with ``spec-zoo costs``
(which also plots it); whoever builds a decoder passes the table in (`cached_table`; `spec_zoo.api.build_decoder` does).
A table is written atomically and checked field by field when read (`table_problem`): a NaN
timing would otherwise price every draft as free or unaffordable and silently change what is
drafted. `spec-zoo costs` measures a new table over one that fails the check, keeping the bad
one aside (`set_aside_unreadable`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from spec_zoo.draft import Draft
from spec_zoo.errors import ConfigError, first_line
from spec_zoo.outputs import atomic_write, save_figure
from spec_zoo.paths import cache_root
from spec_zoo.runtime.cpp_kernels import host_isa

CONTEXT_BUCKET = 64  # `CostTable.at` interpolates once per this many cached tokens
CONTEXTS = (100, 500, 1500)  # cached tokens `measure` times t(M) after: short, mid, Spec-Bench's long prompts
REMEASURE = "re-measure it with `spec-zoo costs` (which keeps the bad table aside)"


@dataclass
class CostTable:
    """seconds[M - 1]: median time of one forward scoring M tokens after ``past`` cached ones;
    contexts: the same curve after other numbers of cached tokens (``{"500": [...], ...}``:
    attention makes scoring dearer, and steeper in M, as the context grows);
    drafts: measured cost of one drafted level per drafter (`draft_key`), in target steps t(1)."""

    seconds: list[float]
    model: str
    runtime: str
    dtype: str
    threads: int
    machine: str
    past: int = 100
    drafts: dict[str, float] = field(default_factory=dict)
    contexts: dict[str, list[float]] = field(default_factory=dict)

    def curves(self) -> dict[int, list[float]]:
        """Every measured curve by its number of cached tokens, shortest context first."""
        return dict(sorted({self.past: self.seconds, **{int(c): t for c, t in self.contexts.items()}}.items()))

    def at(self, cached: int) -> CostTable:
        """This table as it holds after ``cached`` tokens: the curve interpolated linearly between
        the two measured contexts around it (the nearest one outside them), so a drafter priced
        with it weighs a long prompt's dearer scoring. Draft costs stay as measured."""
        curves = self.curves()
        if len(curves) == 1:
            return self
        cached = min(max(cached, min(curves)), max(curves))
        bucket = cached // CONTEXT_BUCKET
        memo = self.__dict__.setdefault("_at", {})
        if bucket not in memo:
            cached = max(bucket * CONTEXT_BUCKET, min(curves))
            lows = [c for c in curves if c <= cached] or [min(curves)]
            highs = [c for c in curves if c >= cached] or [max(curves)]
            lo, hi = max(lows), min(highs)
            w = 0.0 if hi == lo else (cached - lo) / (hi - lo)
            size = min(len(curves[lo]), len(curves[hi]))
            seconds = [(1 - w) * a + w * b for a, b in zip(curves[lo][:size], curves[hi][:size], strict=True)]
            memo[bucket] = CostTable(seconds, self.model, self.runtime, self.dtype, self.threads, self.machine,
                                     cached, self.drafts)
        return memo[bucket]

    def draft_cost(self, key: str | None, default: float) -> float:
        """The measured cost of one drafted level of drafter ``key``, else ``default``."""
        return float(self.drafts.get(key, default)) if key else default

    def relative(self, tokens: int) -> float:
        """t(tokens) / t(1); past the table (a batch's rows), extrapolated along the mean slope of its
        second half: one step of a stepwise curve, or a noisy last pair, would price every extra row
        as free or as a jump."""
        if tokens < 1:
            raise ValueError(f"a forward scores at least one token, not {tokens}")
        t = self.seconds
        if tokens <= len(t):
            return t[tokens - 1] / t[0]
        mid = (len(t) - 1) // 2
        slope = max((t[-1] - t[mid]) / (len(t) - 1 - mid), 0.0) if len(t) > 1 else t[0]
        return (t[-1] + slope * (tokens - len(t))) / t[0]

    def save(self, path: Path) -> Path:
        """Atomically: a reader never sees half a table."""
        return atomic_write(path, json.dumps(asdict(self), indent=1))  # fields only: the `at` memo stays out

    @classmethod
    def load(cls, path, key: str = "cost table", fix: str = REMEASURE) -> CostTable:
        """The table at ``path``; one that cannot be read or fails `table_problem` raises a one-line
        `ConfigError` naming ``key``, the path, what is wrong and ``fix``."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{key}: {path} cannot be read ({first_line(err)}); {fix}.") from None
        if problem := table_problem(raw):
            raise ConfigError(f"{key}: {path}: {problem}; {fix}.")
        return cls(**raw)


def _positive(x) -> bool:
    return type(x) in (int, float) and math.isfinite(x) and x > 0


def table_problem(raw) -> str | None:
    """What makes the JSON value ``raw`` no `CostTable` (None: nothing): every timing and drafting
    cost a positive finite number, curves non-empty lists, contexts keyed by cached tokens, the
    descriptive fields text and the counts integers."""
    if not isinstance(raw, dict):
        return f"it holds a JSON {type(raw).__name__}, not a table (an object)"
    known = {f.name for f in fields(CostTable)}
    if unknown := sorted(set(raw) - known):
        return f"it has unknown field(s) {', '.join(map(repr, unknown))[:80]}"
    if missing := [n for n in ("seconds", "model", "runtime", "dtype", "threads", "machine") if n not in raw]:
        return f"it lacks {', '.join(missing)}"
    if bad := next((n for n in ("model", "runtime", "dtype", "machine") if not isinstance(raw[n], str)), None):
        return f"{bad}={raw[bad]!r:.40} is not text"
    for n, low in (("threads", 0), ("past", 1)):
        if n in raw and (type(raw[n]) is not int or raw[n] < low):
            return f"{n}={raw[n]!r:.40} is not an integer >= {low}"
    contexts, drafts = raw.get("contexts", {}), raw.get("drafts", {})
    if not isinstance(contexts, dict) or not all(str(c).isdigit() and int(c) > 0 for c in contexts):
        return f"contexts={contexts!r:.60} is not an object of curves by cached tokens ({{\"500\": [...]}})"
    for name, curve in (("seconds", raw["seconds"]), *((f"contexts[{c}]", v) for c, v in contexts.items())):
        if not isinstance(curve, list) or not curve:
            return f"{name}={curve!r:.40} is not a non-empty list of timings"
        if (i := next((i for i, x in enumerate(curve) if not _positive(x)), None)) is not None:
            return f"{name}[{i}]={curve[i]!r:.20} is not a positive finite time in seconds"
    if not isinstance(drafts, dict):
        return f"drafts={drafts!r:.40} is not an object of drafting costs by drafter"
    if bad := next((k for k, v in drafts.items() if not _positive(v)), None):
        return f"drafts[{bad!r}]={drafts[bad]!r:.20} is not a positive finite cost (in target steps)"
    return None


def set_aside_unreadable(path: Path) -> Path | None:
    """Move the stored table at ``path`` aside (``<name>.corrupt-<time>.json``) when it fails to
    load, so `spec-zoo costs` can measure a new one in its place without losing it; where it went,
    or None when there is nothing to move."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        CostTable.load(path)
        return None
    except ConfigError:
        aside = path.with_name(f"{path.stem}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
        os.replace(path, aside)
        return aside


def what_costs(target) -> tuple[str, str, str]:
    """(model shape, runtime, dtype) of ``target``: what its cost depends on (with the host and
    the threads), the weights' values aside."""
    c = target.config
    shape = f"{c.model_type}-{c.num_hidden_layers}x{c.hidden_size}-v{target.vocab_size}"
    gemm = getattr(target, "gemm", None)
    runtime = target.runtime + (f"-{gemm}" if gemm not in (None, "inductor") else "")  # another GEMM, another curve
    runtime += f"-{target.weights}" if getattr(target, "weights", "dense") != "dense" else ""  # another width too
    return shape, runtime, str(target.dtype).removeprefix("torch.")


def table_path(target) -> Path:
    """Where the table of ``target`` on this machine lives, keyed by host, model shape,
    runtime, dtype and threads."""
    shape, runtime, dtype = what_costs(target)
    return cache_root() / "costs" / f"{platform.node()}-{shape}-{runtime}-{dtype}-{torch.get_num_threads()}t.json"


def cached_table(target) -> CostTable | None:
    """The table measured for ``target`` on this machine, if `spec-zoo costs` made one."""
    path = table_path(target)
    return CostTable.load(path) if path.is_file() else None


@torch.no_grad()
def measure(target, max_tokens: int = 32, repeats: int = 9, contexts: Sequence[int] = CONTEXTS,
            progress: bool = True) -> CostTable:
    """Time ``target.score`` for 1..``max_tokens`` scored tokens (a chain) after each of
    ``contexts`` cached tokens, interleaving the sizes over ``repeats`` rounds so drift hits
    all alike. The first context's curve is the table's ``seconds``; a static cache bounds the
    contexts (clipped to what it holds)."""
    from tqdm import tqdm

    if not contexts or min(contexts) < 1 or max_tokens < 1:
        raise ConfigError(f"a cost table needs contexts >= 1 cached tokens and max_tokens >= 1 "
                          f"(got contexts={list(contexts)}, max_tokens={max_tokens}).")
    if target.max_length is not None:  # a static cache bounds the context
        contexts = [max(1, min(c, target.max_length - max_tokens - 1)) for c in contexts]
    contexts = list(dict.fromkeys(contexts))
    if hasattr(target, "warm_up"):  # compile first: compiling is not scoring
        target.warm_up()
    curves = {}
    with tqdm(total=repeats * max_tokens * len(contexts), desc="cost table", disable=not progress) as bar:
        for past in contexts:
            prompt = [(7 * i) % target.vocab_size for i in range(past + 1)]
            target.reset()
            target.score(prompt, Draft.empty())
            samples: dict[int, list[float]] = {m: [] for m in range(1, max_tokens + 1)}
            for _ in range(repeats):
                for m in samples:
                    target.rewind(prompt)  # back to `past` cached tokens
                    draft = Draft.chain([(3 * j) % target.vocab_size for j in range(m - 1)])
                    start = time.perf_counter()
                    target.score(prompt, draft)
                    samples[m].append(time.perf_counter() - start)
                    bar.update()
            curves[past] = [statistics.median(samples[m]) for m in samples]
    first, *others = contexts
    return CostTable(curves[first], *what_costs(target), torch.get_num_threads(),
                     f"{platform.processor() or platform.machine()} {host_isa()}", first,
                     contexts={str(c): curves[c] for c in others})


def draft_key(drafter, variant: str = "") -> str:
    """What a drafter's measured cost is filed under: its name, marked when its draft runs
    compiled, then ``variant`` (an exit layer), marked ``-tree`` when it drafts trees (a tree
    level costs more than a chain token)."""
    compiled = "-compiled" if getattr(drafter, "compiled_parts", list)() else ""
    return drafter.name + compiled + variant + ("-tree" if getattr(drafter, "tree", None) is not None else "")


def file_costs(drafter, variant: str = "") -> None:
    """Point the rules that price ``drafter``'s drafting (its draft length, its tree policy)
    at its measured cost in the table (`draft_key`)."""
    for rule in (getattr(drafter, "length", None), getattr(drafter, "tree", None)):
        if rule is not None:
            rule.cost_key = draft_key(drafter, variant)


@torch.no_grad()
def measure_draft(decoder, prompt: list[int], max_new_tokens: int = 48) -> tuple[float, int]:
    """(seconds spent drafting, levels drafted) in one greedy decode of ``prompt`` by ``decoder``:
    a drafter's cost per drafted level is their ratio (a chain's level is one token, a tree's
    one level of nodes; steps that drafted nothing still count their catching up). The first
    step is left out: its drafting includes reading the prompt (a draft model's prefill), a
    cost per prompt, not per level, which swamped drafters that draft rarely."""
    steps = decoder.generate(prompt, max_new_tokens=max_new_tokens, eos_token_ids=[]).stats.steps[1:]
    return sum(s.draft_s for s in steps), sum(s.depth for s in steps)


def draft_rounds(target, decoders: dict, prompts: Sequence[list[int]], rounds: int, max_new_tokens: int = 48,
                 step_repeats: int = 5, contexts: Sequence[int] = CONTEXTS,
                 said=None) -> tuple[list[float], dict[str, list[float]]]:
    """(one target step t(1) per round, each decoder's seconds per drafted level per round) over
    ``rounds`` interleaved rounds, a slow moment of the machine hitting all of them alike: each round
    times t(1) (`measure`), then each decoder's greedy decodes of ``prompts`` (`measure_draft`, their
    seconds over their levels). ``said(round, t1, per)`` runs after each round (progress)."""
    t1: list[float] = []
    per: dict[str, list[float]] = {name: [] for name in decoders}
    for r in range(rounds):
        t1.append(measure(target, max_tokens=1, repeats=step_repeats, contexts=contexts, progress=False).seconds[0])
        for name, decoder in decoders.items():
            seconds, levels = map(sum, zip(*(measure_draft(decoder, p, max_new_tokens) for p in prompts)))
            per[name].append(seconds / max(levels, 1))
        if said is not None:
            said(r, t1, per)
    return t1, per


def plot_table(table: CostTable, path: Path, others: Sequence[CostTable] = ()) -> Path:
    """t(M)/t(1) against M, one line per measured context (and per table in ``others``, e.g.
    another runtime, for comparison), with t(1) in the legend, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for each in (table, *others):
        for past, seconds in each.curves().items():
            ms = range(1, len(seconds) + 1)
            ax.plot(ms, [s / seconds[0] for s in seconds], marker="o", markersize=3,
                    label=f"{each.runtime} {each.dtype}, {past} cached: t(1) {seconds[0] * 1e3:.1f} ms")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens scored in one forward (M)")
    ax.set_ylabel("t(M) / t(1) (medians)")
    ax.set_title(f"{table.model}, {table.threads} thread(s)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)
    return path
