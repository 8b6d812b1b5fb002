"""Benchmark methods: spec-zoo decoders and transformers reference implementations behind
one small interface (`Method.run(prompt_ids, max_new_tokens, seed, request_id) -> Measurement`).

A method is configured by name, as ``conf/method/<name>.yaml``, or inline in the bench's
``methods`` dict (an inline entry overrides the file of the same name, key by key)::

    engine: spec_zoo        # spec_zoo (our loop) or transformers (model.generate, a reference)
    runtime: null           # spec_zoo: the target's runtime, eager or compiled; null = model.runtime
    drafter: ngram          # spec_zoo: an option of conf/drafter/, or a dict with _target_
    verifier: null          # spec_zoo: an option of conf/verifier/ or a dict; null = greedy at
                            #   temperature 0, rejection above (the decoder's default)
    assistant: null         # transformers: a drafter option whose `path` is the assistant model
    params: {}              # spec_zoo: overrides merged into the drafter config;
                            #   transformers: extra generate() kwargs

Drafters and verifiers are built with ``hydra.utils.instantiate``, like the main CLI, so a
user's own drafter (``_target_: my_pkg.MyDrafter``) is benchmarked with no edit here.
"""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

from spec_zoo.bench.records import BASELINE
from spec_zoo.costs import cached_table
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.errors import ConfigError
from spec_zoo.paths import cache_root
from spec_zoo.registry import build_component, compose_option, option_names
from spec_zoo.sampling import SamplingParams
from spec_zoo.target import Target
from spec_zoo.trees import Auto, path_shape

if TYPE_CHECKING:
    from transformers import StaticCache

ENGINES = ("spec_zoo", "transformers")
_SPEC_KEYS = {"engine", "runtime", "drafter", "verifier", "assistant", "params"}
# generate() kwarg -> drafter label of a transformers method without an assistant model
_HF_DRAFTERS = {"prompt_lookup_num_tokens": "prompt_lookup", "assistant_early_exit": "early_exit"}


@dataclass
class MethodSpec:
    """A method as configured, fully resolved, before any model is loaded."""

    name: str
    engine: str = "spec_zoo"
    drafter: dict | None = None  # instantiable drafter config, params already merged in
    verifier: dict | None = None
    assistant: dict | None = None
    params: dict = field(default_factory=dict)
    drafter_label: str = "none"  # the option name (or _target_) recorded as `drafter`
    runtime: str | None = None  # the target's runtime (None: model.runtime)

    @property
    def draft_model_path(self) -> str | None:
        """The draft model directory this method loads (small_model drafter, HF assistant), if any."""
        for cfg in (self.drafter, self.assistant):
            if cfg and isinstance(cfg.get("path"), str):
                return cfg["path"]
        return None

    @property
    def record_params(self) -> dict:
        """What the `params` field of a record shows: the drafter's settings, or generate() kwargs."""
        if self.engine == "spec_zoo":
            return {k: v for k, v in (self.drafter or {}).items() if k != "_target_"}
        extra = {"assistant_model": _assistant_path(self.assistant)} if self.assistant else {}
        return {**self.params, **extra}

    def config_hash(self, run_settings: Mapping) -> str:
        """Identifies what was measured (method + model + generation + seed), so a rerun
        resumes exactly the records of the same configuration."""
        keys = ("name", "engine", "drafter", "verifier", "assistant", "params") + (("runtime",) if self.runtime else ())
        method = {k: getattr(self, k) for k in keys}
        blob = json.dumps({"method": method, "run": run_settings}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _assistant_path(assistant: Mapping) -> str:
    """The assistant model dir; with no ``path``, where its truncated draft is (made on first use)."""
    return assistant.get("path") or str(cache_root() / f"smollm2-135m-trunc{assistant['draft_layers']}")


def _resolve_option(group: str, value, method: str, root: DictConfig | None) -> tuple[dict | None, str | None]:
    """(instantiable config, label) of a drafter/verifier entry: an option name or a dict."""
    if value is None:
        return None, None
    if isinstance(value, str):
        try:
            node, label = compose_option(group, value), value
        except ConfigError as err:
            raise ConfigError(f"method {method}: {err}") from err
    elif isinstance(value, Mapping) and "_target_" in value:
        node, label = OmegaConf.create(dict(value)), str(value["_target_"])
    else:
        raise ConfigError(
            f"method {method}: {group}={value!r}; give an option of conf/{group}/ "
            f"({', '.join(option_names(group))}) or a dict with _target_."
        )
    return _resolved(group, node, root), label


def _resolved(key: str, node, root: DictConfig | None) -> dict:
    """``node`` as a plain dict, its interpolations resolved as if it sat at ``key`` of the
    run config ``root`` (so ``${oc.env:...}`` and ``${model.device}`` both work)."""
    scope = cast(DictConfig, OmegaConf.create(OmegaConf.to_container(root, resolve=False)) if root is not None
                 else OmegaConf.create())
    scope[key] = node
    return cast(dict, OmegaConf.to_container(scope[key], resolve=True))


def _spec(name: str, entry: Mapping, root: DictConfig | None) -> MethodSpec:
    unknown = set(entry) - _SPEC_KEYS
    if unknown:
        raise ConfigError(f"method {name}: unknown keys {sorted(unknown)}; allowed: {sorted(_SPEC_KEYS)}.")
    engine = entry.get("engine", "spec_zoo")
    if engine not in ENGINES:
        raise ConfigError(f"method {name}: engine={engine!r}; allowed values: {', '.join(ENGINES)}.")
    runtime = entry.get("runtime")
    if runtime is not None:
        from spec_zoo.models import RUNTIMES

        if engine != "spec_zoo" or runtime not in RUNTIMES:
            raise ConfigError(f"method {name}: runtime={runtime!r}; a spec_zoo method runs on one of "
                              f"{', '.join(RUNTIMES)} (null = model.runtime).")
    params = dict(entry.get("params") or {})
    if engine == "transformers":
        if entry.get("drafter") is not None or entry.get("verifier") is not None:
            raise ConfigError(f"method {name}: engine=transformers takes no drafter/verifier; "
                              "use assistant (a drafter option) and params (generate() kwargs).")
        assistant, label = _resolve_option("drafter", entry.get("assistant"), name, root)
        if assistant is not None and not ("path" in assistant or "draft_layers" in assistant):
            raise ConfigError(f"method {name}: assistant={label} has no model `path` to load as assistant_model.")
        drafter_label = label or next((lab for key, lab in _HF_DRAFTERS.items() if key in params), "none")
        return MethodSpec(name, engine, assistant=assistant, params=params, drafter_label=drafter_label)
    if entry.get("drafter") is None:
        raise ConfigError(f"method {name}: engine=spec_zoo needs a drafter (e.g. drafter: none).")
    drafter, label = _resolve_option("drafter", entry["drafter"], name, root)
    assert drafter is not None and label is not None  # entry["drafter"] is set (checked above)
    verifier, _ = _resolve_option("verifier", entry.get("verifier"), name, root)
    return MethodSpec(name, engine, {**drafter, **params}, verifier, params=params, drafter_label=label,
                      runtime=runtime)


def resolve_methods(
    methods, default_methods: Sequence[str], root: DictConfig | None = None, method_params: Mapping | None = None
) -> tuple[list[MethodSpec], list[str]]:
    """Method specs to run, baseline first, plus printable notes about skipped methods.

    ``methods``: None (run ``default_methods``, skipping those whose draft model is missing),
    a name, a list of names, or a dict name -> entry (None = the entry of conf/method/<name>).
    A method asked for by name whose draft model is missing is an error, not a skip.
    ``method_params`` are merged into the ``params`` of every spec_zoo method but the
    baseline (the bench's ``method_params`` key: sweep a drafter setting with Hydra multirun).
    """
    if isinstance(methods, str):
        methods = [methods]
    explicit = methods is not None
    chosen = methods if explicit else default_methods
    entries = dict(chosen) if isinstance(chosen, Mapping) else {n: None for n in chosen}
    entries = {BASELINE: entries.pop(BASELINE, None), **entries}
    available = option_names("method")
    specs, notes = [], []
    for name, override in entries.items():
        if name not in available and not override:
            raise ConfigError(f"method {name!r} is unknown; available: {', '.join(available)} "
                              "(or define it inline: methods={name: {drafter: ..., verifier: ...}}).")
        base = OmegaConf.to_container(compose_option("method", name)) if name in available else {}
        entry = _resolved("method", OmegaConf.merge(base, override or {}), root)
        if method_params and name != BASELINE and entry.get("engine", "spec_zoo") == "spec_zoo":
            entry["params"] = {**(entry.get("params") or {}), **method_params}
        spec = _spec(name, entry, root)
        path = spec.draft_model_path
        if path is not None and not Path(path).expanduser().is_dir():
            why = f"its draft model {path} does not exist; point drafter.path at a model dir"
            if explicit:
                raise ConfigError(f"method {name}: {why} (or point drafter.path at one).")
            notes.append(f"skipping {name}: {why}.")
            continue
        specs.append(spec)
    return specs, notes


@dataclass
class Measurement:
    """What one timed generation gives: the output and the contract's measurement fields."""

    output_ids: list[int]
    fields: dict  # prompt_tokens, new_tokens, wall_s, tokens_per_s, target_forwards, tau, alpha, ...
    trace: dict | None = None  # per-step columns (`StepTrace.columns`) of a spec-zoo decoder


class StepTrace:
    """What each step of one generation drafted and accepted, for replaying the run under
    another cost table (`spec_zoo.report.projection`): the accepted path's tree shape
    (`spec_zoo.trees.path_shape`) and, for ``tree=auto``, the (tokens, cost) its policy
    predicted. Subscribed to the decoder's step observers while in its ``with`` block."""

    def __init__(self, decoder: SpeculativeDecoder):
        self.decoder = decoder
        self.steps: list[tuple[list[int], list[int], tuple[float, float] | None]] = []
        policy = getattr(decoder.drafter, "tree", None)
        self.policy = policy if isinstance(policy, Auto) else None

    def __enter__(self) -> StepTrace:
        self.decoder.observers.append(self.observe)
        return self

    def __exit__(self, *exc) -> None:
        self.decoder.observers.remove(self.observe)

    def observe(self, draft, verdict, step) -> None:
        self.steps.append((draft.parents, verdict.path, self._prediction(draft)))

    def _prediction(self, draft) -> tuple[float, float] | None:
        if self.policy is None:
            return None
        if not len(draft) and self.policy.paths:  # the last step drafts nothing: no tree was planned
            return 1.0, 1.0
        return self.policy.prediction

    @property
    def predicted_speedup(self) -> float | None:
        """What ``tree=auto`` predicted for the run: its expected tokens over its predicted
        cost in target forwards, summed over steps (None for other drafters)."""
        predictions = [p for _, _, p in self.steps if p is not None]
        return sum(t for t, _ in predictions) / sum(c for _, c in predictions) if predictions else None

    def columns(self, stats) -> dict:
        """One list per quantity, entry i for step i (``stats``: the run's `RunStats`)."""
        shapes = [path_shape(parents, path) for parents, path, _ in self.steps]
        return {
            "drafted": [s.drafted for s in stats.steps], "depth": [s.depth for s in stats.steps],
            "committed": [s.committed for s in stats.steps], "draft_s": [s.draft_s for s in stats.steps],
            "verify_s": [s.verify_s for s in stats.steps], "widths": [w for w, _ in shapes],
            "ranks": [r for _, r in shapes], "predicted": [p and list(p) for _, _, p in self.steps],
        }


class Method(ABC):
    """A named way to generate, timed by the benchmark."""

    def __init__(self, name: str, drafter: str, verifier: str, params: dict, config_hash: str):
        self.name, self.drafter, self.verifier = name, drafter, verifier
        self.params, self.config_hash = params, config_hash

    @abstractmethod
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int,
            request_id: Hashable | None = None) -> Measurement:
        """Generate after ``prompt_ids`` (EOS included in the output when hit); ``request_id``
        names the question served (drafters that learn across requests hide its earlier output)."""


class SpecZooMethod(Method):
    """A `SpeculativeDecoder` (plain decoding when its drafter is ``none``)."""

    def __init__(self, name, decoder: SpeculativeDecoder, params, config_hash,
                 drafter: str | None = None, stop_strings: Sequence[str] = (), eos_token_ids=None):
        super().__init__(name, drafter or decoder.drafter.name, decoder.verifier.name, params, config_hash)
        self.decoder, self.stop_strings, self.eos_token_ids = decoder, tuple(stop_strings), eos_token_ids

    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        with StepTrace(self.decoder) as trace:
            out = self.decoder.generate(prompt_ids, max_new_tokens, self.stop_strings, self.eos_token_ids, seed,
                                        request_id=request_id)
        stats = out.stats
        fields = {**stats.as_dict(), "drafted": stats.drafted, "accepted": stats.accepted,
                  "predicted_speedup": trace.predicted_speedup}
        return Measurement(out.ids, fields, trace.columns(stats))


class TransformersMethod(Method):
    """``model.generate`` with the same length, sampling and EOS as the spec-zoo methods:
    plain, prompt lookup (``prompt_lookup_num_tokens``) or assisted (``assistant_model``).
    It exposes no per-step counts, so tau, alpha and target_forwards are null."""

    def __init__(self, name, model, sampling: SamplingParams, config_hash, drafter="none",
                 generate_kwargs: Mapping | None = None, params: dict | None = None,
                 eos_token_ids: Sequence[int] | None = None, stop_strings: Sequence[str] = (), tokenizer=None):
        params = dict(generate_kwargs or {}) if params is None else params
        super().__init__(name, drafter, "transformers", params, config_hash)
        self.model = model
        self.kwargs: dict[str, Any] = {"do_sample": not sampling.greedy}
        if eos_token_ids:  # else generate() falls back to the model's generation_config
            eos = sorted(eos_token_ids)
            self.kwargs.update(eos_token_id=eos, pad_token_id=eos[0])
        if not sampling.greedy:
            self.kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        if stop_strings:
            self.kwargs.update(stop_strings=list(stop_strings), tokenizer=tokenizer)
        self.kwargs.update(generate_kwargs or {})
        self.cache: StaticCache | None = None
        if self.kwargs.get("cache_implementation") == "static":
            self._compile_static()

    def _compile_static(self, max_cache_len: int = 2048) -> None:
        """transformers' documented fast path: a static cache and the model's forward compiled
        (on a copy, so the other methods keep the eager model). generate() would size a new
        cache per prompt (a recompile each); one cache of ``max_cache_len`` is reused instead.
        Two untimed generations with prompts of different lengths compile the prefill's
        dynamic-shape graph and the one-token graph before anything is measured."""
        import copy

        from transformers import StaticCache

        self.kwargs.pop("cache_implementation")
        self.model = copy.deepcopy(self.model)
        self.model.forward = torch.compile(self.model.forward, mode="reduce-overhead", fullgraph=True)
        self.cache = StaticCache(config=self.model.config, max_cache_len=max_cache_len)
        start = time.perf_counter()
        for length in (5, 9):
            self.run(list(range(3, 3 + length)), 4, 0)
        self.compile_s = time.perf_counter() - start

    @torch.no_grad()
    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=self.model.device)
        extra = {}
        if self.cache is not None:
            self.cache.reset()
            extra["cache"] = self.cache
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, **self.kwargs, **extra
        )
        wall = time.perf_counter() - start
        new = out[0, len(prompt_ids):].tolist()
        fields = {
            "prompt_tokens": len(prompt_ids), "new_tokens": len(new), "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else 0.0,
            "target_forwards": None, "tau": None, "alpha": None, "drafted": None, "accepted": None,
            "draft_s": None, "verify_s": None, "accept_per_position": None, "predicted_speedup": None,
        }
        return Measurement(new, fields)


def build_method(spec: MethodSpec, target: Target, sampling: SamplingParams, config_hash: str, seed: int = 0,
                 stop_strings: Sequence[str] = (), eos_token_ids: Sequence[int] | None = None) -> Method:
    """Instantiate a resolved spec on a loaded target (loads draft/assistant models)."""
    if spec.engine == "spec_zoo":
        key = f"methods.{spec.name}"
        drafter = build_component(OmegaConf.create(spec.drafter), f"{key}.drafter")
        verifier = build_component(OmegaConf.create(spec.verifier), f"{key}.verifier") if spec.verifier else None
        decoder = SpeculativeDecoder(target, drafter, verifier, sampling, seed, cost_table=cached_table(target))
        return SpecZooMethod(spec.name, decoder, spec.record_params, config_hash,
                             spec.drafter_label, stop_strings, eos_token_ids)
    kwargs = dict(spec.params)
    if spec.assistant:
        from spec_zoo.models import load_causal_lm, truncated_draft

        a = spec.assistant
        path = a.get("path") or truncated_draft(int(a["draft_layers"]))
        kwargs["assistant_model"], _ = load_causal_lm(path, a.get("dtype", "float32"), a.get("device", "cpu"))
    return TransformersMethod(spec.name, target.model, sampling, config_hash, spec.drafter_label, kwargs,
                              spec.record_params, eos_token_ids, stop_strings, target.tokenizer)
