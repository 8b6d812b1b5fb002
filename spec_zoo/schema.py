"""Typed validation of composed configs, before any model loads.

The shipped YAML is the schema: every key's type is the type of its shipped default
(``generation.max_new_tokens: 128`` -> an integer), a drafter's or verifier's keys are its
constructor's parameters with their annotations (so a custom ``_target_`` is checked
too), and `Keys` add what a default cannot say (keys whose default is null, ranges, the
words a key takes): the core's own `LIMITS` / `TYPES`, and what a command adds (spec-zoo-train:
its pipeline's keys and each recipe's, registered from the method's folder). Every problem
ends as one `ConfigError` line, ``<key>: <problem>; <fix>``.
Values that a command line or YAML spells loosely are normalised in place: ``yes/no/on/off``
for booleans, a plain string for ``stop_strings`` (one stop string, not its characters).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from spec_zoo.errors import ConfigError
from spec_zoo.registry import compose, option_names
from spec_zoo.sampling import stop_string_list

BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
ANY = object()  # a key whose type is not known: any value passes


@dataclass(frozen=True)
class Limit:
    """Allowed range of a number; ``example`` is a good value to suggest."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    example: str | None = None

    def problem(self, value) -> str | None:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return f"must be {'>' if self.low_open else '>='} {_number(self.low)}"
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return f"must be {'<' if self.high_open else '<='} {_number(self.high)}"
        return None


def _number(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


POSITIVE, NON_NEGATIVE = Limit(low=1), Limit(low=0)
SEED = Limit(low=0, high=2**64 - 1, example="0")  # what torch.Generator.manual_seed takes
UNIT = Limit(low=0, high=1, high_open=True)

# Ranges, by dotted key, of the keys of spec-zoo's and spec-zoo-bench's configs (training's own
# keys come with `spec_zoo.train`: its pipeline's and each recipe's, `Keys`).
LIMITS: dict[str, Limit] = {
    "seed": SEED,
    "generation.temperature": Limit(low=0, example="0.7"),
    "generation.top_k": NON_NEGATIVE,
    "generation.top_p": Limit(low=0, high=1, low_open=True, example="0.9"),
    "generation.max_new_tokens": Limit(low=1, example="64"),
    "repeats": POSITIVE,
    "warmup_tokens": NON_NEGATIVE,
    "plan_tokens_per_s": Limit(low=0, low_open=True, example="25"),
    "dataset.per_category": POSITIVE,
    "threads": POSITIVE,
    "batch_size": POSITIVE,
    "model.max_cache_len": Limit(low=2, example="2048"),
}

# Types of keys whose shipped default (null, or a list) does not tell: (types, null allowed).
TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "prompt": ((str, list), False),
    "prompt_file": ((str,), True),
    "prompts_file": ((str,), True),
    "batch_policy": ((str, dict), False),
    "out": ((str,), True),
    "seed": ((int,), False),
    "model.path": ((str,), True),
    "model.buckets": ((list, str), False),
    "model.freezing": ((bool, str), False),
    "generation.stop_strings": ((list, str), True),
    "dataset.path": ((str,), True),
    "dataset.per_category": ((int,), True),
    "dataset.categories": ((list, str), True),
    "dataset.category_field": ((str,), True),
    "dataset.id_field": ((str,), True),
    "summarize": ((str,), True),
    "batches": ((str,), True),
    "methods": ((list, dict, str), True),
    "method_params": ((dict,), True),
}


@dataclass(frozen=True)
class Keys:
    """What the shipped defaults cannot say about some keys: ranges (`Limit`), the types of
    keys whose default is null or a list (``(types, null allowed)``), and the words a key
    takes. The core's own are `core_keys`; a command that knows more keys adds them
    (``core_keys() | more``: spec-zoo-train adds its pipeline's and its recipe's)."""

    limits: Mapping[str, Limit] = field(default_factory=dict)
    types: Mapping[str, tuple[tuple[type, ...], bool]] = field(default_factory=dict)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __or__(self, other: Keys) -> Keys:
        return Keys({**self.limits, **other.limits}, {**self.types, **other.types}, {**self.choices, **other.choices})


@functools.cache
def core_keys() -> Keys:
    """The keys of spec-zoo's and spec-zoo-bench's configs; the words of model keys come from
    the module that defines them."""
    from spec_zoo.models import DEVICES, DTYPES, RUNTIMES
    from spec_zoo.runtime.quant_gemm import WEIGHTS

    words = {"model.dtype": (*DTYPES, "auto"), "model.device": tuple(DEVICES), "model.runtime": tuple(RUNTIMES),
             "model.weights": (*WEIGHTS, "auto"), "model.freezing": ("auto",)}
    return Keys(LIMITS, TYPES, words)


COMPONENT_GROUPS = ("drafter", "verifier")  # keys = the constructor's parameters
DRAFTER_GROUPS = ("tree",)  # option groups (conf/tree/) a drafter takes as a key (drafter.tree=topk)


def fail(key: str, problem: str, fix: str) -> ConfigError:
    """The one error format: ``<key>: <problem>; <fix>``."""
    return ConfigError(f"{key}: {problem}; {fix}")


def check_value(key: str, value, types, nullable: bool = False, example=None, keys: Keys | None = None):
    """``value`` checked against ``types`` (and the ranges and words of ``keys``, by default
    `core_keys`); returns it normalised."""
    keys = keys or core_keys()
    if value is None or types is ANY:
        if value is None and not (nullable or types is ANY):
            raise fail(key, "must be set (got null)", _fix(key, types, example))
        return value
    if bool in types and not isinstance(value, bool) and isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
        return BOOL_WORDS[value.strip().lower()]
    ok = (
        (isinstance(value, bool) and bool in types)
        or (not isinstance(value, bool) and isinstance(value, int) and (int in types or float in types))
        or (isinstance(value, float) and float in types)
        or (isinstance(value, str) and str in types)
        or (isinstance(value, (list, tuple, ListConfig)) and list in types)
        or (isinstance(value, (dict, DictConfig)) and dict in types)
    )
    if not ok:
        raise fail(key, f"{value!r} is not {_names(types)}", _fix(key, types, example))
    if key in keys.choices and isinstance(value, str) and value not in keys.choices[key]:  # the words a key takes
        raise fail(key, f"{value!r} is not supported", f"use one of: {', '.join(keys.choices[key])}")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(key, f"{value!r} is not a finite number",
                   _fix(key, types, example or getattr(keys.limits.get(key), "example", None)))
    limit = keys.limits.get(key)
    if limit and isinstance(value, (int, float)) and not isinstance(value, bool) and (why := limit.problem(value)):
        raise fail(key, f"{value!r} {why}", f"e.g. {key}={limit.example or _suggest(limit)}")
    return value


def _fix(key: str, types, example) -> str:
    """``e.g. key=<example>``; a long example (the default prompt) would bury the fix: its type instead."""
    short = example not in (None, "") and len(str(example)) <= 60
    return f"e.g. {key}={example}" if short else f"set {key} to {_names(types)}"


def _suggest(limit: Limit) -> str:
    return f"{limit.low + 1:g}" if limit.low is not None else f"{limit.high:g}"


def _names(types) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping"}
    if float in types and int in types:
        types = tuple(t for t in types if t is not int)
    return " or ".join(names.get(t, t.__name__) for t in types)


def _types_of_default(default):
    """The types a key accepts, judged from its shipped default."""
    if default is None or (isinstance(default, str) and "${" in default):
        return ANY
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, (int, float)):
        return (type(default),) if isinstance(default, int) else (float,)
    if isinstance(default, (list, tuple, ListConfig)):
        return (list,)
    if isinstance(default, (dict, DictConfig)):
        return (dict,)
    return (type(default),)


def unknown_key(key: str, known) -> ConfigError:
    """An unknown key, with the closest known one (a typo) or the list of keys."""
    prefix, _, name = key.rpartition(".")
    known = [k for k in known if not k.startswith("_")]
    close = difflib.get_close_matches(name, known, n=1)
    where = f"{prefix}.{close[0]}" if prefix and close else close[0] if close else None
    if where:
        hint = f"did you mean {where}?"
    elif known:
        hint = f"the keys are: {', '.join(sorted(known))}"
    else:
        hint = f"{prefix or 'this config'} takes no keys here; choose an option that has it first (e.g. drafter=ngram)"
    return fail(key, "unknown key", hint)


# -- drafters and verifiers: the constructor is the schema ------------------------------------------

_ANNOTATION_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict}


def _annotation_types(annotation):
    """(types, nullable) of a parameter annotation such as ``'float | None'``; ANY when it
    names something else (a path, a module, a tensor)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [p.strip() for p in text.replace("Optional[", "").rstrip("]").split("|")]
    nullable = "None" in parts
    parts = [p for p in parts if p != "None"]
    if not parts or any(p not in _ANNOTATION_TYPES for p in parts):
        return ANY, True
    return tuple(_ANNOTATION_TYPES[p] for p in parts), nullable


@functools.cache
def constructor_params(cls) -> dict[str, inspect.Parameter] | None:
    """Keyword parameters of ``cls(...)`` (a class or a factory function), following ``**kwargs`` passed on to a
    base class; None when some ``**kwargs`` cannot be followed (then any key is accepted)."""
    params: dict[str, inspect.Parameter] = {}
    if not isinstance(cls, type):  # a factory function
        found = inspect.signature(cls).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in found):
            return None
        return {p.name: p for p in found if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        var_kw = False
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                var_kw = True
            elif p.kind is not inspect.Parameter.VAR_POSITIONAL:
                params.setdefault(p.name, p)
        if not var_kw:
            return params
    return None


def locate(group: str, target):
    """The class named by ``<group>._target_``, or a one-line error."""
    from hydra._internal.utils import _locate

    if not isinstance(target, str) or not target:
        raise fail(f"{group}._target_", f"{target!r} is not a class path", f"e.g. {group}._target_=my_pkg.MyClass")
    try:
        return _locate(target)
    except Exception as err:  # Hydra wraps import errors of every kind
        reason = str(err.__cause__ or err).splitlines()[0]
        raise fail(f"{group}._target_", f"cannot import {target} ({reason})",
                   "install the package or put it on PYTHONPATH, and check the spelling") from None


def check_component(group: str, node: Mapping) -> dict:
    """Keys of a drafter/verifier node against its class's constructor; returns the
    normalised values by dotted key."""
    cls = locate(group, node.get("_target_"))
    params = constructor_params(cls)
    changes = {}
    for name, value in node.items():
        key = f"{group}.{name}"
        if name.startswith("_") or params is None or _interpolation(value):
            continue
        if name not in params:
            raise unknown_key(key, params)
        p = params[name]
        default = None if p.default is inspect.Parameter.empty else p.default
        if p.annotation is not inspect.Parameter.empty:
            types, nullable = _annotation_types(p.annotation)
        else:
            types, nullable = _types_of_default(default), True
        example = default if isinstance(default, (int, float, str)) else None
        checked = check_value(key, value, types, nullable or default is None, example)
        if checked is not value:
            changes[key] = checked
    return changes


# -- whole configs ---------------------------------------------------------------------------------


def _interpolation(value) -> bool:
    return isinstance(value, str) and "${" in value


def check_config(cfg: DictConfig, defaults: DictConfig, keys: Keys | None = None) -> None:
    """Validate ``cfg`` against ``defaults`` (the same config name composed with no overrides)
    and ``keys`` (by default `core_keys`): unknown keys, types, ranges; drafter/verifier nodes
    against their classes. Loosely spelled values are normalised in ``cfg`` (read-only and
    struct flags lifted for that)."""
    raw = cast(dict, OmegaConf.to_container(cfg, resolve=False))
    changes = _walk(raw, cast(dict, OmegaConf.to_container(defaults, resolve=False)), "", keys or core_keys())
    if not changes:
        return
    struct, readonly = OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg)
    OmegaConf.set_readonly(cfg, False)
    OmegaConf.set_struct(cfg, False)
    try:
        for key, value in changes.items():
            OmegaConf.update(cfg, key, value, merge=False)
    finally:
        OmegaConf.set_struct(cfg, struct)
        OmegaConf.set_readonly(cfg, readonly)


def _walk(node: Mapping, defaults: Mapping, prefix: str, keys: Keys) -> dict:
    changes = {}
    for name, value in node.items():
        key = f"{prefix}{name}"
        if not prefix and name in COMPONENT_GROUPS and isinstance(value, Mapping):
            changes.update(check_component(name, value))
            continue
        if _interpolation(value) or (not prefix and name == "hydra"):
            continue
        if isinstance(defaults, Mapping) and defaults and name not in defaults and key not in keys.types:
            raise unknown_key(key, defaults)
        default = defaults.get(name) if isinstance(defaults, Mapping) else None
        if isinstance(value, Mapping) and key not in keys.types:
            changes.update(_walk(value, default if isinstance(default, Mapping) else {}, f"{key}.", keys))
            continue
        types, nullable = keys.types.get(key, (_types_of_default(default), False))
        limit = keys.limits.get(key)
        example = limit.example if limit and limit.example else (
            default if isinstance(default, (int, float, str)) and not isinstance(default, bool) else None)
        checked = check_value(key, value, types, nullable, example, keys)
        if key in NORMALISE:
            checked = NORMALISE[key](checked)
        if checked is not value:
            changes[key] = checked
    return changes


def _stop_strings(value):
    return list(stop_string_list(value))


NORMALISE = {"generation.stop_strings": _stop_strings}  # key -> value in its one canonical form


# Flags after which the command line is Hydra's business (help, printing, sweeps, other config dirs).
HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-p", "--package", "--resolve",
               "-m", "--multirun", "-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path",
               "-sc", "--shell-completion", "--run", "-r", "--version"}


def check_command_line(config_name: str, argv: list[str], keys: Keys | None = None) -> None:
    """Compose and validate what ``argv`` asks for, before Hydra runs it, so a typo'd key, an
    unknown option or an unquoted comma ends in one `ConfigError` line rather than Hydra's
    multi-line report (exit 1). Command lines with Hydra flags are left to Hydra."""
    if any(a.split("=", 1)[0] in HYDRA_FLAGS for a in argv):
        return
    overrides = [a for a in argv if not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    validate(composed(config_name, overrides), config_name, keys)


def composed(config_name: str, overrides: list[str]) -> DictConfig:
    """`compose`, with a failure turned into one line naming the override at fault."""
    try:
        return compose(config_name, overrides)
    except Exception as err:  # Hydra raises several types, some plain ValueErrors
        first = err
    for i in range(len(overrides)):  # the first prefix that fails holds the culprit last
        try:
            compose(config_name, overrides[: i + 1])
        except Exception as err:
            raise _override_error(config_name, overrides[:i], overrides[i], err) from None
    raise ConfigError(f"{config_name}: {str(first).splitlines()[0]}; check the command line") from None


def _override_error(config_name: str, before: list[str], override: str, err: Exception) -> ConfigError:
    from hydra.errors import MissingConfigException

    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    if key in DRAFTER_GROUPS:  # its options are chosen inside a drafter, not at the top
        return fail(key, "is a drafter's setting, not a top-level option",
                    f"pass drafter.{key}={value or 'NAME'} with a drafter that drafts trees, e.g. drafter=small_model "
                    f"drafter.{key}={value or 'NAME'} "
                    f"(spec-zoo-bench: params: {{{key}: {value or 'NAME'}}} of a method)")
    text = str(err)
    options = option_names(key) if "." not in key else []
    if isinstance(err, MissingConfigException) or (options and "Config group override" in text):
        choices = getattr(err, "options", None) or options
        return fail(key, f"{value!r} is not an option", f"choose one of {', '.join(choices)}")
    if "Could not override" in text or "not in struct" in text:
        parent = key.rpartition(".")[0]
        base = compose(config_name, before)
        node = OmegaConf.select(base, parent) if parent else base
        return unknown_key(key, list(node.keys()) if isinstance(node, DictConfig) else [])
    return fail(key or override, f"cannot read {override!r} ({text.splitlines()[0]})",
                "quote values with commas, spaces or brackets, e.g. \"prompt='a, b'\"")


@functools.cache
def shipped_defaults(config_name: str) -> DictConfig:
    """``config_name`` composed with no overrides: the types every key should have."""
    return compose(config_name, [])


def validate(cfg: DictConfig, config_name: str, keys: Keys | None = None) -> DictConfig:
    """`check_config` against the shipped defaults of ``config_name`` and ``keys``; returns ``cfg``."""
    check_config(cfg, shipped_defaults(config_name), keys)
    return cfg
