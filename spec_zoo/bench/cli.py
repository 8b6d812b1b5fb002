"""``spec-zoo-bench``: the Hydra entry point (conf/bench.yaml). Validates everything cheap
(dataset, methods, sampling, model config) before loading a model, then runs the
benchmark into ``out/results.jsonl`` (with ``traces=true`` also ``out/traces.jsonl``) and
writes ``out/summary.md``."""

from __future__ import annotations

import copy
import json
import sys
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import cast

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from spec_zoo.api import quiet_loading
from spec_zoo.batch_policy import BatchPolicy, batch_policy
from spec_zoo.bench.dataset import load_dataset, prompt_encoder
from spec_zoo.bench.methods import build_method
from spec_zoo.bench.peer_method import build_peer_method
from spec_zoo.bench.peers import PEERS
from spec_zoo.bench.records import FAILURE_FILE, LOCK_FILE, TRACE_FILE, check_schema, failure_warnings, read_records
from spec_zoo.bench.runner import run_benchmark, run_context
from spec_zoo.bench.specs import resolve_methods
from spec_zoo.bench.summary import Summary, summarize, summarize_file
from spec_zoo.cli import checked_command_line
from spec_zoo.console import keep
from spec_zoo.errors import ConfigError
from spec_zoo.outputs import (
    atomic_write,
    check_outputs,
    check_replaceable,
    check_writable,
    one_writer,
    resolved,
    signed_markdown,
    write_owned,
)
from spec_zoo.registry import CONF_DIR
from spec_zoo.sampling import SamplingParams
from spec_zoo.schema import locate, validate

#: what to do when out= holds a summary.md or compile_s.json spec-zoo did not write
OUT_FIX = "move it away, or give another out= directory"


def check_out_files(out: Path, key: str = "out") -> None:
    """The files a run writes beside its records (summary.md, compile_s.json) may replace only
    what spec-zoo wrote there (`check_replaceable`): checked before any model loads."""
    check_outputs(out, ("summary.md", "compile_s.json"), key, OUT_FIX)


#: what to do when out= holds a results, traces or failures file spec-zoo-bench did not write
RESULTS_FIX = "give another out= directory (a rerun into this one resumes only the results spec-zoo-bench wrote there)"


def check_results(out: Path) -> list[dict]:
    """The records already in ``out``'s results.jsonl, once it and the files appended beside it
    (traces, failures) are spec-zoo-bench's own (`read_records`): a user's file there, or an empty
    one, is refused before any model loads, and never appended to."""
    for name in (TRACE_FILE, FAILURE_FILE):
        read_records(out / name, "out", RESULTS_FIX, empty_ok=False, warn=False)
    path = out / "results.jsonl"
    return check_schema(read_records(path, "out", RESULTS_FIX, empty_ok=False, warn=False), str(path))


def write_summary(summary: Summary, out_dir, key: str = "out") -> Path:
    """Write ``summary.md`` into ``out_dir`` (atomically, replacing only a summary spec-zoo
    wrote), print it, and return its path."""
    text = summary.to_markdown()
    path = write_owned(Path(out_dir) / "summary.md", signed_markdown(text, "spec-zoo-bench"), key, OUT_FIX)
    print(text)
    print(f"summary written to {path}")
    return path


def bench(cfg: DictConfig) -> Summary | None:
    """Run (or, with ``summarize=PATH``, only summarize; with ``batches=DIR``, only plot a batch-size
    sweep) the benchmark described by ``cfg``; its summary (None: a plan or a sweep's plot)."""
    validate(cfg, "bench")
    if cfg.get("batches"):
        from spec_zoo.bench.batches import write_batches

        folder = resolved(cfg.batches)
        if not folder.is_dir():
            raise ConfigError(f"batches: {cfg.batches} is not a directory; pass the out= of a batch-size sweep.")
        write_batches(folder)
        return None
    if cfg.summarize:
        results = resolved(cfg.summarize)
        if not results.is_file():
            raise ConfigError(f"summarize: {cfg.summarize} is not a file; pass the path of a results.jsonl.")
        check_replaceable(results.parent / "summary.md", "summarize", OUT_FIX.replace(
            "give another out= directory", "copy the results file elsewhere and summarize that copy"))
        summary = summarize_file(results)
        write_summary(summary, results.parent, "summarize")
        return summary

    from spec_zoo.models import DTYPES, check_model_config, check_runtime
    from spec_zoo.runtime import GEMMS
    from spec_zoo.runtime.quant_gemm import check_weights

    if cfg.seed + cfg.repeats - 1 > 2**64 - 1:  # repeat r runs with seed + r
        raise ConfigError(f"seed: {cfg.seed} + {cfg.repeats - 1} (repeat r uses seed + r) passes 2^64 - 1, the "
                          "largest seed; e.g. seed=0.")
    data, gen = cfg.dataset, cfg.generation
    policy = batch_policy(cfg.get("batch_policy"))  # a bad policy is refused before anything loads
    questions = load_dataset(data)
    if empty := next((q for q in questions if any(not t.strip() for t in q.turns)), None):
        raise ConfigError(f"dataset: question {empty.question_id} has an empty prompt; fill it in or remove "
                          "that line (spec-zoo refuses empty prompts too).")
    sampling = SamplingParams(gen.temperature, gen.top_k, gen.top_p)
    method_params: dict | None = None
    if cfg.get("method_params"):
        method_params = cast(dict, OmegaConf.to_container(cfg.method_params, resolve=True))
    specs, notes = resolve_methods(OmegaConf.to_container(cfg.methods) if cfg.methods is not None else None,
                                   list(cfg.default_methods), cfg, method_params)
    specs = name_custom_drafters(compatible(specs, sampling, cfg.get("skip_incompatible", False), notes))
    for spec in specs:
        if spec.engine in PEERS and (not sampling.greedy or gen.stop_strings):
            raise ConfigError(f"method {spec.name}: a peer engine is measured greedy and without stop strings; set "
                              "generation.temperature=0 generation.stop_strings=[].")
    check_model_config(cfg.model)
    if auto := [key for key in ("runtime", "dtype", "weights") if cfg.model.get(key) == "auto"]:
        shown = " ".join(f"model.{key}=auto" for key in auto)
        raise ConfigError(f"model.{auto[0]}=auto: a benchmark compares settings it names, and auto picks per host; "
                          f"give model.{auto[0]}= one of its values (`spec-zoo {shown}` shows in its summary line what "
                          "auto picks here).")
    loaded = cfg.model.get("weights", "dense")  # the width the run's target is loaded at
    for spec in specs:
        dtype, gemm = spec.model.get("dtype", cfg.model.dtype), spec.model.get("gemm", cfg.model.get("gemm"))
        check_runtime(spec.runtime or cfg.model.runtime, dtype, cfg.model.device, f"methods.{spec.name}")
        weights = spec.model.get("weights", loaded)
        check_weights(weights, dtype, f"methods.{spec.name}")
        if weights != loaded != "dense":
            raise ConfigError(f"methods.{spec.name}: weights={weights}, but the run loads model.weights={loaded} "
                              "(the float weights are not kept); run with model.weights=dense and give each method "
                              "its width (model: {weights: native}).")
        if dtype not in DTYPES:
            raise ConfigError(f"methods.{spec.name}.model.dtype={dtype!r} is not supported; use one of: "
                              f"{', '.join(DTYPES)}.")
        if (gemm is not None and gemm not in GEMMS) or GEMMS.get(gemm) not in (None, dtype):
            raise ConfigError(f"methods.{spec.name}: gemm={gemm!r} with dtype={dtype}; model.gemm is one of "
                              f"{', '.join(GEMMS)} (amx computes in bfloat16): set the method's model: {{gemm: ...}}.")
        if cfg.model.get("device_map") is not None and (spec.runtime or cfg.model.runtime) == "compiled":
            raise ConfigError(f"model.device_map: method {spec.name} runs on the compiled runtime (one CPU graph), "
                              "which cannot run a target placed by a device map; drop that method or model.device_map.")
    out = output_dir(cfg)
    results_path = out / "results.jsonl"
    with ExitStack() as held:
        held.enter_context(removed_if_left_empty(out))
        if not cfg.get("dry_run"):  # one writer per results directory: a second run into it is refused
            check_writable(out, "out")
            check_out_files(out)
            check_results(out)  # a user's file is refused before the lock is taken: nothing is left in out=
            held.enter_context(one_writer(out / LOCK_FILE, busy=(
                f"out: {out} is being written by another spec-zoo-bench run (it holds {out / LOCK_FILE}); "
                "wait for it to finish (a rerun then resumes), or give another out= directory.")))
            keep(f"the records written so far stay in {results_path}; rerun the same command to resume")
        return _run(cfg, specs, questions, sampling, policy, notes, out, results_path)


@contextmanager
def removed_if_left_empty(out: Path):
    """``out`` removed again when this run made it and fails (or is interrupted) before writing
    anything in it but its lock file: a failed run leaves no empty directory behind."""
    made = not out.exists()
    try:
        yield
    except BaseException:
        if made and out.is_dir() and {p.name for p in out.iterdir()} <= {LOCK_FILE}:
            (out / LOCK_FILE).unlink(missing_ok=True)
            with suppress(OSError):  # another run got in meanwhile: its files stay
                out.rmdir()
        raise


def _run(cfg: DictConfig, specs, questions, sampling: SamplingParams, policy: BatchPolicy | None, notes: list[str],
         out: Path, results_path: Path):
    """The plan (``dry_run``) or the measured run of `bench`, once ``out`` is this run's."""
    from spec_zoo.decoder import SpeculativeDecoder
    from spec_zoo.models import load_target
    from spec_zoo.runtime import DEFAULT_BUCKETS

    data, gen = cfg.dataset, cfg.generation
    existing = check_results(out)  # before any model loads
    model = cast(dict, OmegaConf.to_container(cfg.model))
    for key, unset in (("device_map", None), ("weights", "dense")):  # unset: the records of runs made before the
        if model.get(key, unset) == unset:                           # key existed still resume
            model.pop(key, None)
    if model.get("buckets") == "auto" and "weights" not in model:  # as it was before auto: the same records
        model["buckets"] = list(DEFAULT_BUCKETS)
    run_settings = {"model": model, "generation": OmegaConf.to_container(gen),
                    "dataset": {"name": data.name, "path": data.path}, "seed": cfg.seed}
    if cfg.batch_size != 1:  # another configuration; unset, the records of runs made before the key still resume
        run_settings["batch_size"] = cfg.batch_size
        raw = cfg.get("batch_policy")
        run_settings["batch_policy"] = OmegaConf.to_container(raw) if isinstance(raw, DictConfig) else raw
    hashes = [s.config_hash(run_settings) for s in specs]
    for note in notes:
        print(note)
    if cfg.get("dry_run"):
        from spec_zoo.bench.plan import plan_text

        print(plan_text(specs, hashes, questions, cfg.repeats, gen.max_new_tokens, existing,
                        cfg.get("plan_tokens_per_s", 25.0), results_path))
        return None
    print(f"{len(questions)} questions x {len(specs)} methods ({', '.join(s.name for s in specs)}) "
          f"x {cfg.repeats} repeat(s), {cfg.batch_size} request(s) at a time -> {results_path}")

    target = load_target(**cfg.model)
    plain = SpeculativeDecoder(target, sampling=sampling)  # encodes prompts; its EOS set serves every method
    eos = sorted(plain._eos_ids())

    def built(spec, config_hash, on):
        return build_method(spec, on, sampling, config_hash, cfg.seed, list(gen.stop_strings), eos, policy)

    # peer engines start first: their workers load (vLLM: minutes) while our compiled runtimes compile
    peers = {s.name: build_peer_method(s, target, h, eos) for s, h in zip(specs, hashes) if s.engine in PEERS}
    targets = runtime_targets(target, specs, cfg.model)
    methods = [peers.get(s.name) or built(s, h, targets[target_name(s, cfg.model)]) for s, h in zip(specs, hashes)]
    report_compile_times(targets, methods, out)
    records = run_benchmark(
        methods, questions, prompt_encoder(plain, gen.chat), results_path,
        target=target, context=run_context(cfg.model.name, data.name, sampling.temperature, target.device),
        max_new_tokens=gen.max_new_tokens, repeats=cfg.repeats, seed=cfg.seed, greedy=sampling.greedy,
        warmup_tokens=cfg.warmup_tokens, progress=cfg.progress, traces_path=out / TRACE_FILE if cfg.traces else None,
        batch_size=cfg.batch_size,
    )
    summary = summarize(records)
    failed = failure_warnings(read_records(out / FAILURE_FILE), records, hashes)
    summary = replace(summary, warnings=(*summary.warnings, *failed))
    write_summary(summary, out)
    return summary


COMPILED_SETTINGS = ("max_cache_len", "buckets", "freezing", "gemm_backends", "gemm", "attention")


def target_name(spec, model_cfg) -> str:
    """The name of the target a spec_zoo method decodes on: its runtime, and the model settings it
    sets for itself (``compiled``, ``compiled dtype=float32 gemm=inductor``)."""
    return " ".join([spec.runtime or model_cfg.runtime, *(f"{k}={v}" for k, v in sorted(spec.model.items()))])


def runtime_targets(target, specs, model_cfg) -> dict:
    """The loaded target on every runtime and dtype a method asks for, by `target_name` (one weight
    copy per dtype; each target its own cache); compiled ones compile all their graphs now, before
    anything is timed."""
    from spec_zoo.models import on_runtime

    run = cast(dict, OmegaConf.to_container(model_cfg))
    models = {run["dtype"]: target.model}
    targets = {model_cfg.runtime: target}
    for spec in specs:
        name = target_name(spec, model_cfg)
        if spec.engine != "spec_zoo" or name in targets:
            continue
        settings = {**run, "runtime": spec.runtime or model_cfg.runtime, **spec.model}
        if settings["dtype"] not in models:  # the same weights in the method's dtype
            models[settings["dtype"]] = copy.deepcopy(target.model).to(getattr(torch, settings["dtype"]))
        targets[name] = on_runtime(settings["runtime"], models[settings["dtype"]], target.tokenizer,
                                   weights=settings.get("weights", "dense"),
                                   **{k: v for k, v in settings.items() if k in COMPILED_SETTINGS})
    for each in targets.values():
        if hasattr(each, "warm_up"):
            each.warm_up()
    return targets


def report_compile_times(targets: dict, methods, out: Path) -> None:
    """Compile time is paid once per machine and never counted in a speedup: it is printed
    and kept in ``compile_s.json`` next to the results, apart from the timed records."""
    times = {f"target_{rt}": t.compile_s for rt, t in targets.items() if getattr(t, "compile_s", None) is not None}
    times.update({m.name: m.compile_s for m in methods if getattr(m, "compile_s", None) is not None})
    if times:
        print("compile time (s, not in any speedup): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
        path = out / "compile_s.json"
        old = json.loads(path.read_text()) if path.is_file() else {}  # ours (check_out_files): merged
        atomic_write(check_replaceable(path, "out", OUT_FIX), json.dumps(
            {**old, **times, "format": "spec-zoo-compile-times"}, indent=1))


def name_custom_drafters(specs):
    """Records name a drafter as the user chose it: the option name (``small_model_tree``), or,
    for an inline ``_target_``, the class's ``name`` (as the spec-zoo summary line does)."""
    for spec in specs:
        if spec.engine == "spec_zoo" and spec.drafter and spec.drafter_label == spec.drafter.get("_target_"):
            spec.drafter_label = getattr(locate("drafter", spec.drafter_label), "name", spec.drafter_label)
    return specs


def compatible(specs, sampling: SamplingParams, skip: bool, notes: list[str]):
    """Check each method's verifier against the sampling settings before a model loads
    (e.g. verifier=greedy needs temperature 0); an incompatible one is an error, or, with
    ``skip`` (``skip_incompatible=true``, as in the drafter_x_verifier preset), a note."""
    from hydra.utils import instantiate

    kept = []
    for spec in specs:
        try:
            if spec.verifier and hasattr(verifier := instantiate(spec.verifier), "check"):
                verifier.check(sampling)
        except ConfigError as err:
            if not skip:
                raise ConfigError(f"method {spec.name}: {err}") from err
            notes.append(f"skipping {spec.name}: {err}")
            continue
        kept.append(spec)
    return kept


def output_dir(cfg: DictConfig) -> Path:
    """Where this run's results.jsonl goes: ``out``; in a multirun (``-m``) where ``out`` was
    given on the command line, ``out/<this job's overrides>``, so every job appends to its
    own file under one directory (`spec-zoo-report out` merges them)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    out = resolved(cfg.out)
    if not HydraConfig.initialized():
        return out
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or not any(o.split("=", 1)[0].lstrip("+~") == "out" for o in hc.overrides.task):
        return out
    return out / job_dirname(hc.job.override_dirname, hc.job.num)


def job_dirname(override_dirname: str, num: int) -> str:
    """A stable, readable directory name for one job of a sweep: its overrides, leaving out
    file paths (too long, and rarely swept); a long name is cut and made unique by a hash."""
    import hashlib

    kept = [o for o in override_dirname.split(",") if "/" not in o.split("=", 1)[-1]]
    name = ",".join(kept) or f"job{num}"
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha256(override_dirname.encode()).hexdigest()[:10]
    return name


@hydra.main(config_path=CONF_DIR, config_name="bench", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        with quiet_loading():  # load bars and per-call generate() notices would bury the progress bar
            bench(cfg)
    except ConfigError as err:
        print(f"spec-zoo-bench: error: {err}", file=sys.stderr)
        sys.exit(2)


def _with_value(arg: str, key: str, value: str) -> str:
    """``arg`` with ``value`` for ``key`` when it sets ``key`` (``key=``, ``+key=``), quoted for
    Hydra's override grammar."""
    name, _, _ = arg.partition("=")
    if "=" not in arg or name.lstrip("+~") != key:
        return arg
    return f"{name}={value!r}" if any(c in value for c in " ,'\"()[]{}=:$\\") else f"{name}={value}"


def main() -> None:
    """Console script: ``--dry-run`` is accepted as ``dry_run=true`` (print the plan, run nothing).
    The command line is validated first (one line, exit 2); Hydra gets the current dir as its run
    dir (it writes nothing there), so ``out=`` is made by the run once validated, never by Hydra
    before (a refused run leaves no empty ``out=`` or outputs/bench/)."""
    from spec_zoo.registry import register_plugins

    sys.argv = ["dry_run=true" if a in ("--dry-run", "--plan") else a for a in sys.argv]
    try:
        register_plugins()  # installed drafters/verifiers can be benchmarked by name
    except ConfigError as err:
        print(f"spec-zoo-bench: error: {err}", file=sys.stderr)
        sys.exit(2)
    checked_command_line("bench", "spec-zoo-bench: error")
    given = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
    if given.get("out") and Path(given["out"]).exists() and not Path(given["out"]).is_dir():
        print(f"spec-zoo-bench: error: out: {given['out']} is a file; give a directory (results.jsonl and "
              "summary.md go in it).", file=sys.stderr)
        sys.exit(2)
    try:  # Hydra makes out= (its run dir) before bench() runs: the resolved one, never A/nosuch of A/nosuch/..
        if given.get("out"):
            out = check_writable(given["out"], "out")
            sys.argv = [_with_value(a, "out", str(out)) for a in sys.argv]
    except ConfigError as err:
        print(f"spec-zoo-bench: error: {err}", file=sys.stderr)
        sys.exit(2)
    if not any(a.lstrip("+").startswith(("hydra.run.dir=", "-m", "--multirun")) for a in sys.argv[1:]):
        sys.argv.append("hydra.run.dir=.")  # Hydra would make out= before the run is validated; the run makes it
    _hydra_main()


if __name__ == "__main__":
    main()
