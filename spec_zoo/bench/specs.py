"""Bench methods as configured: each ``conf/method/<name>.yaml`` or inline entry of the
bench's ``methods`` resolved into a `MethodSpec` (drafter and verifier configs composed,
params merged, interpolations resolved) before any model loads::

    engine: spec_zoo        # spec_zoo (our loop), transformers (model.generate, a reference) or a
                            #   peer engine in its own venv (vllm: `spec_zoo.bench.peers`)
    runtime: null           # spec_zoo: the target's runtime, eager or compiled; null = model.runtime
    model: {}               # spec_zoo: the target's numerics for this method, over the run's model
                            #   settings: dtype, gemm, attention (e.g. {dtype: float32, gemm: inductor}
                            #   beside a bfloat16 run: both dtypes in one interleaved run)
    drafter: ngram          # spec_zoo: an option of conf/drafter/, or a dict with _target_
    verifier: null          # spec_zoo: an option of conf/verifier/ or a dict; null = greedy at
                            #   temperature 0, rejection above (the decoder's default)
    assistant: null         # transformers: a drafter option whose `path` is the assistant model
    params: {}              # spec_zoo: overrides merged into the drafter config;
                            #   transformers: extra generate() kwargs; a peer: the engine's arguments

An inline entry overrides the file of the same name, key by key. Each spec also names its own
plain decoding (`MethodSpec.plain`): the plain method of the same engine, runtime and model settings in the run
(a peer engine's speculation is compared with that engine's plain decoding), else ``ar``.
`spec_zoo.bench.methods` builds a spec into a runnable method.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from spec_zoo.bench.peers import PEERS
from spec_zoo.bench.records import BASELINE
from spec_zoo.errors import ConfigError
from spec_zoo.paths import cache_root
from spec_zoo.registry import compose_option, option_names

ENGINES = ("spec_zoo", "transformers", *PEERS)
_SPEC_KEYS = {"engine", "runtime", "model", "drafter", "verifier", "assistant", "params"}
MODEL_KEYS = ("dtype", "gemm", "attention", "weights")  # the target settings a method may set for itself (its numerics)
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
    model: dict = field(default_factory=dict)  # the target's settings over the run's (`MODEL_KEYS`)
    plain: str = BASELINE  # the method whose output and speed are this one's own plain decoding

    @property
    def draft_model_path(self) -> str | None:
        """The draft model directory this method loads (small_model drafter, HF assistant), if any."""
        for cfg in (self.drafter, self.assistant):
            if cfg and isinstance(cfg.get("path"), str):
                return cfg["path"]
        return None

    @property
    def target_key(self) -> tuple:
        """What decides the target a method decodes on: its engine, runtime and model settings."""
        return self.engine, self.runtime, tuple(sorted(self.model.items()))

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
        keys: tuple[str, ...] = ("name", "engine", "drafter", "verifier", "assistant", "params")
        keys += (("runtime",) if self.runtime else ()) + (("model",) if self.model else ())
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
    model = dict(entry.get("model") or {})
    if model and (engine != "spec_zoo" or not isinstance(entry.get("model"), Mapping) or set(model) - set(MODEL_KEYS)):
        raise ConfigError(f"method {name}: model={entry.get('model')!r}; a spec_zoo method may set the target's "
                          f"{', '.join(MODEL_KEYS)} for itself (e.g. model: {{dtype: float32}}); other engines "
                          "run the run's model settings.")
    params = dict(entry.get("params") or {})
    if engine in PEERS:
        if any(entry.get(k) is not None for k in ("drafter", "verifier", "assistant")):
            raise ConfigError(f"method {name}: engine={engine} takes no drafter/verifier/assistant; its params are "
                              "the engine's own arguments (docs/peers.md).")
        PEERS[engine].check(params, name)
        return MethodSpec(name, engine, params=params, drafter_label=PEERS[engine].drafter_label(params))
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
                      runtime=runtime, model=model)


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
    return with_plains(specs), notes


def with_plains(specs: list[MethodSpec]) -> list[MethodSpec]:
    """``specs`` with each speculative spec_zoo or peer method pointed at the plain method of its own
    engine, runtime and model settings listed before it (a compiled method at ``ar_compiled`` when listed before it,
    else at ``ar``); speculative peer methods move last, after their engine's plain method, which
    the run must have."""
    specs = sorted(specs, key=lambda s: (s.name != BASELINE, s.engine in PEERS and s.drafter_label != "none"))
    plains: dict[tuple, str] = {}
    for spec in specs:
        if spec.drafter_label == "none":
            plains.setdefault(spec.target_key, spec.name)
            continue
        if spec.engine == "transformers":
            continue
        plain = plains.get(spec.target_key)
        if spec.engine in PEERS and plain is None:
            raise ConfigError(f"method {spec.name}: its speedup is over {spec.engine}'s own plain decoding; add a "
                              f"plain {spec.engine} method to methods (e.g. {spec.engine}_ar).")
        spec.plain = plain or BASELINE
    return specs
