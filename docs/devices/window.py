"""The prepared GPU window (issue 43): one command, at most 10 minutes, no carried weights.

A cost table t(M) depends on a model's shapes, not its values, so every stage runs on randomly
initialised models; nothing is downloaded and no trained weights travel. Stages, each with its
own time budget, each writing its error and letting the next one run:

1. environment: python, torch, CUDA, the GPU, transformers, where spec_zoo was imported from.
2. costs: t(M) for M = 1..64 scored tokens after 100, 500 and 1500 cached ones
   (`spec_zoo.costs.measure`, a `CostTable` per runtime) in bfloat16 on random models of the
   embedded target's shape (SmolLM2-135M) and of Llama 3.2 1B and Llama 3.1 8B, on the eager
   runtime (`spec_zoo.runtime.target.Target`) and on the compiled one (`spec_zoo.runtime.CompiledTarget`
   built directly: the configuration refuses ``runtime=compiled`` off the CPU, so this times the
   same dynamic graph under inductor's CUDA backend with its CUDA graphs switched on, and says
   whether inductor kept or skipped them).
3. identity: every shipped drafter (its untrained form on a tiny random float64 model, as the test
   suite builds it: tests/drafts.py, plus suffix and lookahead) on CUDA: greedy output equal to
   plain decoding on the same device, and a seeded sampled run repeated with the same seed equal.
4. projection: this CPU's Spec-Bench traces (``--traces``, default docs/trees/projection) replayed
   with ``spec-zoo-project`` under each measured table of the embedded target's shape.
5. plot: t(M) of every shape and runtime in one figure.

On the device machine run it through docs/devices/window.sh (a python with CUDA torch, the carried
wheels of docs/devices/wheels.sh installed beside this checkout). Results, at most 8 files in ``--out``
(default ``$OUT``): environment.json, log.txt,
costs_<shape>.json (one per shape: each runtime's `CostTable` under ``tables``), identity.json,
projection.md, costs.png. docs/devices.md gives the carry plan and the command.

``--dry`` (automatic when CUDA is missing) runs every stage on this CPU at tiny sizes: tiny
shapes, M = 1..4, float32; tests/test_window.py runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# HF configs of the shapes timed (the values are random: only the shapes matter)
SHAPES: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct): the embedded target
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    # meta-llama/Llama-3.2-1B
    "llama-1b": dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                     max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    # meta-llama/Llama-3.1-8B
    "llama-8b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                     max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
}
EMBEDDED = "smollm2-135m"  # the shape whose tables the projection uses
RUNTIMES = ("eager", "compiled")
# the order units are measured in: what matters most first, so a budget cut drops the least
UNITS = [("smollm2-135m", "eager"), ("smollm2-135m", "compiled"), ("llama-1b", "eager"), ("llama-8b", "eager"),
         ("llama-1b", "compiled"), ("llama-8b", "compiled")]
DEFAULT_TRACES = ("docs/trees/projection",)  # eager float32 Spec-Bench traces with tree runs (their ranks)

# seconds per stage on the GPU (a stage stops at its budget; the next one runs): ~8 of the 10 minutes
BUDGETS = {"environment": 15, "costs": 350, "identity": 90, "projection": 30, "plot": 15}
UNIT_BUDGET = {"eager": 45, "compiled": 120}  # one shape on one runtime, the compile included
DRY_BUDGETS = {"environment": 20, "costs": 120, "identity": 120, "projection": 60, "plot": 30}

# the sizes of a dry run (CPU): each shape kept in its proportions' spirit (GQA, tied or not), tiny
DRY_SHAPE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)


class StageTimeout(Exception):
    """A stage (or a unit of one) ran past its budget."""


@contextlib.contextmanager
def budget(seconds: float | None) -> Iterator[None]:
    """Raise `StageTimeout` in the main thread after ``seconds`` (no limit without SIGALRM)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise StageTimeout(f"over its budget of {seconds:.0f} s")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


class Log:
    """Progress lines, time-stamped from the start, to stdout and log.txt."""

    def __init__(self, path: Path):
        self.start = time.perf_counter()
        self.file = path.open("w")

    def __call__(self, message: str) -> None:
        line = f"[{time.perf_counter() - self.start:6.1f} s] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def error_text(err: BaseException) -> str:
    first = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {first}"


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


class Window:
    """The run: its options, where it writes, what each stage found."""

    def __init__(self, args: argparse.Namespace, log: Log):
        import torch

        self.args, self.log, self.out = args, log, args.out
        self.dry = args.dry
        self.device = "cpu" if self.dry else "cuda"
        self.dtype = torch.float32 if self.dry else torch.bfloat16
        self.budgets = DRY_BUDGETS if self.dry else BUDGETS
        if self.dry:
            torch.set_num_threads(1)  # tiny models: threads only contend (the test suite runs them on one too)
        self.tables: dict[str, dict[str, Any]] = {}  # shape -> runtime -> CostTable
        self.status: dict[str, str] = {}

    # -- running stages ---------------------------------------------------------------------------
    def stage(self, name: str, fn: Callable[[], None]) -> None:
        if name not in self.args.stages:
            self.status[name] = "not asked for"
            return
        seconds = self.budgets[name] * self.args.budget_scale
        self.log(f"stage {name}: start (budget {seconds:.0f} s)")
        start = time.perf_counter()
        try:
            with budget(seconds):
                fn()
            self.status[name] = "ok"
        except Exception as err:  # a failed stage is a finding: record it, run the next one
            self.status[name] = f"error: {error_text(err)}"
            self.log(f"stage {name}: ERROR {error_text(err)}")
            self.log.file.write(traceback.format_exc())
            self.log.file.flush()
        self.log(f"stage {name}: {self.status[name]} after {time.perf_counter() - start:.1f} s")

    # -- 1. environment -----------------------------------------------------------------------------
    def environment(self) -> None:
        import torch
        import transformers

        import spec_zoo

        env: dict[str, Any] = {
            "argv": sys.argv, "dry": self.dry, "python": sys.version, "executable": sys.executable,
            "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "threads": torch.get_num_threads(),
            "transformers": transformers.__version__, "spec_zoo": str(Path(spec_zoo.__file__).parent),
            "budgets_s": self.budgets, "budget_scale": self.args.budget_scale,
        }
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                          "memory_gib": round(props.total_memory / 2**30, 1),
                          "multiprocessors": props.multi_processor_count}
        for name, command in (("git", ["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
                              ("nvidia_smi", ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,"
                                              "clocks.max.sm,memory.used,memory.total", "--format=csv"])):
            try:
                env[name] = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
            except (OSError, subprocess.SubprocessError) as err:
                env[name] = error_text(err)
        write_json(self.out / "environment.json", env)
        gpu = env.get("gpu", {}).get("name", "no GPU")
        self.log(f"torch {env['torch']} (CUDA {env['torch_cuda']}), {gpu}, transformers {env['transformers']}, "
                 f"spec_zoo from {env['spec_zoo']}")

    # -- 2. costs -----------------------------------------------------------------------------------
    def config(self, shape: str):
        from transformers import LlamaConfig

        fields = dict(SHAPES[shape])
        if self.dry:  # tiny, tied or not as the shape is
            fields = {**DRY_SHAPE, "tie_word_embeddings": fields["tie_word_embeddings"]}
        return LlamaConfig(**fields, bos_token_id=0, eos_token_id=1, pad_token_id=0)

    def random_model(self, shape: str, seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        with torch.device(self.device):  # made where it runs: an 8B model is never built on the host
            model = AutoModelForCausalLM.from_config(self.config(shape), dtype=self.dtype)
        return model.eval().requires_grad_(False)

    def target(self, model, runtime: str, shape: str):
        """The runtime's target for ``model``, timed to the end of its kernels (`Synced`)."""
        if runtime == "eager":
            from spec_zoo.runtime.target import Target

            return Synced(Target(model))
        import spec_zoo.runtime.compiled as compiled

        if not self.dry:  # the window's own process: random weights, keyed by shape and seed, not by hashing GBs;
            # never in the dry run, which shares a process with the test suite (every later compile of a model of
            # that shape would be served this one's graph)
            compiled.fingerprint = lambda module: f"window-{shape}-seed0"
        cache = 64 if self.dry else 2048
        if self.dry:  # the CPU runtime as shipped, minus the C++ attention kernel's build (minutes on a CPU)
            target = compiled.CompiledTarget(model, max_cache_len=cache, attention="inductor", fallback=False)
        else:  # inductor's CUDA backend: no C++ micro-GEMM, no freezing; its CUDA graphs on
            target = compiled.CompiledTarget(model, max_cache_len=cache, attention="inductor", gemm="inductor",
                                             gemm_backends="ATEN", freezing=False, fallback=False)
            target.settings["triton.cudagraphs"] = True
        return Synced(target)

    def costs(self) -> None:
        import torch

        from spec_zoo.costs import measure

        stage_end = time.perf_counter() + self.budgets["costs"] * self.args.budget_scale - 2
        units = [u for u in UNITS if u[0] in self.args.shapes and u[1] in self.args.runtimes]
        results: dict[str, dict[str, Any]] = {
            s: {"shape": s, "config": SHAPES[s], "dry_config": DRY_SHAPE if self.dry else None,
                "device": self.device, "dtype": str(self.dtype).removeprefix("torch."),
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "max_tokens": self.args.max_tokens, "contexts": self.args.contexts, "repeats": self.args.repeats,
                "tables": {}, "notes": {}, "errors": {}}
            for s in dict.fromkeys(u[0] for u in units)}
        for shape, runtime in units:
            left = stage_end - time.perf_counter()
            record = results[shape]
            if left < 5:
                record["errors"][runtime] = "skipped: the costs stage's budget was spent"
                self.log(f"costs {shape} {runtime}: skipped (budget spent)")
                write_json(self.out / f"costs_{shape}.json", record)
                continue
            seconds = min(UNIT_BUDGET[runtime] * self.args.budget_scale * (3 if self.dry else 1), left)
            self.log(f"costs {shape} {runtime}: building (budget {seconds:.0f} s)")
            start, model, target = time.perf_counter(), None, None
            counters = _inductor_counters()
            try:
                with budget(seconds):
                    model = self.random_model(shape)
                    target = self.target(model, runtime, shape)
                    table = measure(target, max_tokens=self.args.max_tokens, repeats=self.args.repeats,
                                    contexts=self.args.contexts, progress=False)
                if torch.cuda.is_available() and not self.dry:  # the table's machine is the GPU, not its host
                    table.machine = f"{torch.cuda.get_device_name()} (host {table.machine})"
                self.tables.setdefault(shape, {})[runtime] = table
                record["tables"][runtime] = asdict(table)
                note = {"seconds": round(time.perf_counter() - start, 1),
                        "compile_s": getattr(target.inner, "compile_s", None)}
                if runtime == "compiled":
                    note["inductor_counters"] = _inductor_counters(since=counters)
                record["notes"][runtime] = note
                t = table.seconds
                self.log(f"costs {shape} {runtime}: t(1) {t[0] * 1e3:.2f} ms, t({len(t)}) {t[-1] * 1e3:.2f} ms "
                         f"(x{t[-1] / t[0]:.2f}) after {table.past} cached; {note['seconds']} s")
            except Exception as err:  # one unit failing (memory, a compiler error) leaves the others to run
                record["errors"][runtime] = error_text(err)
                self.log(f"costs {shape} {runtime}: ERROR {error_text(err)}")
                self.log.file.write(traceback.format_exc())
            finally:
                del model, target
                if not self.dry:  # the GPU's memory back before the next shape (tiny models need no sweep)
                    _release()
            write_json(self.out / f"costs_{shape}.json", record)

    # -- 3. identity -------------------------------------------------------------------------------
    def identity(self) -> None:
        import torch

        from spec_zoo import SamplingParams, SpeculativeDecoder, Target
        from spec_zoo.drafters.lookahead import LookaheadDrafter
        from spec_zoo.drafters.suffix import SuffixDrafter
        from spec_zoo.testing import repetitive_prompt, tiny_llama

        if str(ROOT) not in sys.path:
            sys.path.append(str(ROOT))  # tests/drafts.py: the drafters' untrained forms (after the installed spec_zoo)
        from tests.drafts import drafter_lineup

        seeds = (0,) if self.dry else (0, 1)
        new = 16 if self.dry else 40
        report: dict[str, Any] = {"device": self.device, "dtype": "float64", "seeds": list(seeds),
                                  "max_new_tokens": new, "drafters": {}}
        path = self.out / "identity.json"
        for seed in seeds:
            model = tiny_llama(seed, sharpness=3.0).to(self.device)
            prompt = repetitive_prompt(seed)
            plain = SpeculativeDecoder(Target(model)).generate(prompt, max_new_tokens=new, eos_token_ids=[]).ids
            greedy = {**drafter_lineup(model), "suffix": SuffixDrafter, "lookahead": LookaheadDrafter}
            sampled = {**drafter_lineup(model, sampled=True), "suffix": SuffixDrafter, "lookahead": LookaheadDrafter}
            for name in self.args.drafters or greedy:
                row = report["drafters"].setdefault(name, {"greedy_equal": 0, "seeded_equal": 0, "runs": 0})
                try:
                    drafter = on_device(greedy[name](), self.device)
                    ids = SpeculativeDecoder(Target(model), drafter).generate(
                        prompt, max_new_tokens=new, eos_token_ids=[]).ids
                    row["greedy_equal"] += ids == plain
                    if ids != plain:
                        at = next((i for i, (a, b) in enumerate(zip(ids, plain)) if a != b), min(len(ids), len(plain)))
                        row.setdefault("greedy_first_difference", []).append({"seed": seed, "at": at})
                    # two fresh decoders (a drafter may learn across requests: suffix does), one seed
                    a, b = (SpeculativeDecoder(Target(model), on_device(sampled[name](), self.device),
                                               sampling=SamplingParams(temperature=1.0)).generate(
                                prompt, max_new_tokens=new, eos_token_ids=[], seed=11).ids for _ in range(2))
                    row["seeded_equal"] += a == b
                    row["runs"] += 1
                except StageTimeout:
                    raise
                except Exception as err:  # a drafter failing on this device is this stage's finding
                    row.setdefault("errors", []).append(f"seed {seed}: {error_text(err)}")
            del model
            write_json(path, report)
        bad = [n for n, r in report["drafters"].items()
               if r.get("errors") or r["greedy_equal"] < r["runs"] or r["seeded_equal"] < r["runs"]]
        report["summary"] = {"drafters": len(report["drafters"]), "all_equal": not bad, "failing": bad}
        write_json(path, report)
        self.log(f"identity: {len(report['drafters']) - len(bad)}/{len(report['drafters'])} drafters equal to plain "
                 f"decoding and seeded-reproducible on {self.device}" + (f"; failing: {', '.join(bad)}" if bad else ""))
        if not torch.cuda.is_available() and not self.dry:
            raise RuntimeError("no CUDA: the identity stage ran on the CPU")

    # -- 4. projection -----------------------------------------------------------------------------
    def projection(self) -> None:
        from spec_zoo.report.cli import project

        tables = self.tables.get(EMBEDDED, {})
        lines = ["# Spec-Bench traces of this project's CPU projected onto the window's tables", ""]
        if not tables:
            lines.append(f"No cost table of {EMBEDDED} was measured (see log.txt): nothing to project.")
        traces = [p for p in self.args.traces if (ROOT / p).exists() or Path(p).exists()]
        for missing in sorted(set(self.args.traces) - set(traces)):
            lines.append(f"- traces {missing}: not here (carry it: docs/devices.md)")
        with tempfile.TemporaryDirectory() as tmp:
            for runtime, table in tables.items():
                costs = Path(tmp) / f"{EMBEDDED}-{runtime}.json"
                table.save(costs)
                for trace in traces:
                    where = ROOT / trace if (ROOT / trace).exists() else Path(trace)
                    printed, errors = io.StringIO(), io.StringIO()
                    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
                        code = project([str(where), "--costs", str(costs)])
                    text = printed.getvalue().replace(str(costs), f"costs_{EMBEDDED}.json[tables][{runtime}]")
                    text = text.replace(str(where), trace)
                    lines += ["", f"## {trace} under the {runtime} table ({table.dtype}, {self.device})", "",
                              text if code == 0 else f"spec-zoo-project exited {code}: {errors.getvalue().strip()}"]
                    self.log(f"projection {trace} x {runtime}: exit {code}")
        (self.out / "projection.md").write_text("\n".join(lines).rstrip() + "\n")

    # -- 5. plot -----------------------------------------------------------------------------------
    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shapes = [s for s in self.tables if self.tables[s]]
        if not shapes:
            raise RuntimeError("no cost table was measured: nothing to plot")
        fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.4), squeeze=False)
        for ax, shape in zip(axes[0], shapes):
            for runtime, table in self.tables[shape].items():
                for past, seconds in table.curves().items():
                    ax.plot(range(1, len(seconds) + 1), [s * 1e3 for s in seconds], marker="o", markersize=2,
                            label=f"{runtime}, {past} cached")
            ax.set_title(f"{shape} ({'dry, tiny' if self.dry else 'random weights'})", fontsize=9)
            ax.set_xlabel("tokens scored in one forward (M)")
            ax.set_ylabel("t(M), ms (median)")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=6)
        fig.suptitle(f"{self.device}, {str(self.dtype).removeprefix('torch.')}", fontsize=9)
        fig.tight_layout()
        fig.savefig(self.out / "costs.png", dpi=60 if self.dry else 110)
        plt.close(fig)


class Synced:
    """A target whose ``score`` returns once the device has finished it (CUDA runs asynchronously:
    `measure` would otherwise time the launches)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def score(self, *args, **kwargs):
        import torch

        out = self.inner.score(*args, **kwargs)
        if self.inner.device.type == "cuda":
            torch.cuda.synchronize()
        return out


def on_device(drafter, device: str):
    """``drafter`` with the modules it holds moved to ``device``, as a shipped artefact is when loaded
    (`spec_zoo.draft_head.load_head`); the drafters of a cascade or a merge too."""
    import torch

    if device == "cpu":
        return drafter
    for value in vars(drafter).values():
        if isinstance(value, torch.nn.Module):
            value.to(device)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if hasattr(item, "propose"):
                    on_device(item, device)
    return drafter


def _inductor_counters(since: dict | None = None) -> dict:
    """Inductor's counters (cudagraph_skips says when CUDA graphs were not used), minus ``since``."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    now = {f"{group}.{key}": value for group in ("inductor", "stats") for key, value in counters[group].items()}
    return {k: v - (since or {}).get(k, 0) for k, v in now.items() if v - (since or {}).get(k, 0)}


def _release() -> None:
    import gc

    import torch

    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "window-out"),
                   help="where the (at most 8) result files go (default: $OUT, else ./window-out)")
    p.add_argument("--dry", action="store_true", help="tiny sizes on the CPU (automatic when CUDA is missing)")
    p.add_argument("--stages", default="environment,costs,identity,projection,plot")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help="eager, compiled")
    p.add_argument("--traces", nargs="*", default=list(DEFAULT_TRACES),
                   help="traced spec-zoo-bench results to project (paths in the repo, or anywhere)")
    p.add_argument("--drafters", default=None, help="identity: these line-up names only (default: all)")
    p.add_argument("--max-tokens", type=int, default=None, help="largest M timed (default 64; dry 4)")
    p.add_argument("--repeats", type=int, default=None, help="rounds per M (default 7; dry 1)")
    p.add_argument("--contexts", default=None, help="cached tokens, comma-separated (default 100,500,1500; dry 8,16)")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every stage's time budget")
    args = p.parse_args(argv)
    import torch

    if not args.dry and not torch.cuda.is_available():
        print(f"window: CUDA is not available to {sys.executable} (torch {torch.__version__}): running --dry",
              flush=True)
        args.dry = True
    args.stages = args.stages.split(",")
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    args.drafters = [d for d in (args.drafters or "").split(",") if d]
    for s in args.shapes:
        if s not in SHAPES:
            p.error(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    args.max_tokens = args.max_tokens or (4 if args.dry else 64)
    args.repeats = args.repeats or (1 if args.dry else 7)
    args.contexts = [int(c) for c in (args.contexts or ("8,16" if args.dry else "100,500,1500")).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "log.txt")
    window = Window(args, log)
    log(f"window: {'DRY (CPU, tiny sizes)' if args.dry else 'CUDA'}; out {args.out}; stages {','.join(args.stages)}")
    for name in ("environment", "costs", "identity", "projection", "plot"):
        window.stage(name, getattr(window, name))
    log("done: " + "; ".join(f"{k} {v}" for k, v in window.status.items()))
    log.file.close()
    return int(any(v.startswith("error") for v in window.status.values()))


if __name__ == "__main__":
    sys.exit(main())
