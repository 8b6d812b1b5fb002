"""Which drafters, verifiers and bench methods exist: the YAML options shipped in conf/,
plus classes that installed packages register under the entry-point groups
``spec_zoo.drafters`` and ``spec_zoo.verifiers``.

A plugin package declares, in its own pyproject.toml::

    [project.entry-points."spec_zoo.drafters"]
    bigram = "my_pkg.bigram:BigramDrafter"

and after ``pip install`` it runs as ``spec-zoo drafter=bigram drafter.<arg>=...``: each
entry point becomes a config option of its group (Hydra's ConfigStore), holding ``_target_``
and the class's constructor defaults, so its keys are typed, listed and overridable like
those of a shipped option. ``spec-zoo list`` prints everything with one line each.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import importlib.resources
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from spec_zoo.errors import ConfigError, first_line
from spec_zoo.interfaces import Drafter, Verifier

CONF_DIR = str(importlib.resources.files("spec_zoo.conf"))  # the shipped configs (Hydra's search path)
ENTRY_POINT_GROUPS = {"drafter": "spec_zoo.drafters", "verifier": "spec_zoo.verifiers"}
_PLAIN = (bool, int, float, str, type(None))


@dataclass
class Option:
    """One choice of a config group, as ``spec-zoo list`` shows it."""

    group: str
    name: str
    about: str
    source: str  # "spec-zoo" or the distribution that registered it
    lossless: bool | None = None  # verifiers (and methods, through theirs); None: not applicable


def _base_class(group: str) -> type[Drafter] | type[Verifier]:
    bases: dict[str, type[Drafter] | type[Verifier]] = {"drafter": Drafter, "verifier": Verifier}
    return bases[group]


def shipped_options(group: str) -> list[str]:
    """The option names of ``conf/<group>/*.yaml``."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """name -> entry point of the plugins installed for ``group``; a name registered twice, or
    one that shadows a shipped option, is an error naming both sides."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    shipped = set(shipped_options(group))
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[group]):
        where = ep.dist.name if ep.dist else "?"
        if ep.name in shipped:
            raise ConfigError(f"{group} {ep.name!r} registered by package {where} ({ep.value}) clashes with the "
                              f"shipped {group}={ep.name}; rename the entry point in that package's pyproject.toml.")
        if ep.name in found and found[ep.name].value != ep.value:
            other = found[ep.name]
            raise ConfigError(f"{group} {ep.name!r} is registered twice: {other.value} (package "
                              f"{other.dist.name if other.dist else '?'}) and {ep.value} (package {where}); "
                              "uninstall one or rename its entry point.")
        found[ep.name] = ep
    return found


def load_plugin(group: str, ep: importlib.metadata.EntryPoint) -> type[Drafter] | type[Verifier]:
    """The class behind ``ep``, checked to be a `Drafter` / `Verifier` subclass."""
    try:
        cls = ep.load()
    except Exception as e:  # an import error inside the plugin package
        raise ConfigError(f"{group}={ep.name}: its entry point {ep.value} cannot be imported ({type(e).__name__}: "
                          f"{e}); fix or reinstall that package.") from None
    base = _base_class(group)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ConfigError(f"{group}={ep.name}: its entry point {ep.value} is not a subclass of "
                          f"spec_zoo.{base.__name__}; point the entry point at the {group} class.")
    return cls


def plugin_node(cls: type[Drafter] | type[Verifier]) -> dict:
    """The config of a plugin option: ``_target_`` plus the constructor's plain defaults."""
    node: dict[str, object] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD and isinstance(p.default, _PLAIN):
            node[name] = p.default
    return node


def register_plugins() -> None:
    """Make every installed plugin a config option of its group (idempotent, cheap when
    none is installed). Called before any config is composed."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group in ENTRY_POINT_GROUPS:
        for name, ep in entry_points(group).items():
            store.store(group=group, name=name, node=plugin_node(load_plugin(group, ep)))


def option_names(group: str) -> list[str]:
    """Option names of a config group: ``conf/<group>/*.yaml`` plus, for drafters and
    verifiers, the installed plugins."""
    names = shipped_options(group)
    if group in ENTRY_POINT_GROUPS:
        register_plugins()
        names = sorted(names + list(entry_points(group)))
    return names


def compose(config_name: str | None, overrides: list[str]) -> DictConfig:
    """Hydra's compose of ``config_name`` (the shipped config dir; None: the overrides alone)
    with ``overrides``, inside a running @hydra.main app or not."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside a @hydra.main app: its search path
        return hydra_compose(config_name, overrides=overrides)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides)


def compose_option(group: str, name: str):
    """One option of a config group, composed by Hydra (so its defaults list is honoured):
    how bench methods and composed drafters read the options they name. Composed once per
    option and search path (a bench resolves hundreds; each compose costs ~0.3 s); a copy
    is returned, so callers may change it."""
    if name not in shipped_options(group) and name not in option_names(group):  # plugins: scanned only when needed
        raise ConfigError(f"{group}={name!r} is unknown; available: {', '.join(option_names(group))}.")
    return copy.deepcopy(_composed_option(group, name, _search_path()))


def _search_path() -> tuple[str, ...]:
    """Where Hydra looks for configs now: a running @hydra.main app's search path, else the shipped dir.
    Hydra's own sources are left out and file sources named by their dir, so composing inside
    ``initialize_config_dir(CONF_DIR)`` and outside any app share one cache entry."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return tuple(source.path if source.scheme() == "file" else source.full_path()
                     for source in GlobalHydra.instance().config_loader().get_sources()
                     if source.provider not in ("hydra", "schema"))
    return (CONF_DIR,)


@functools.lru_cache(maxsize=512)
def _composed_option(group: str, name: str, search_path: tuple[str, ...]):
    return compose(None, [f"+{group}={name}"])[group]


def build_option(group: str, name: str, **values):
    """Instantiate the shipped option ``conf/<group>/<name>.yaml`` with ``values`` for its
    keys: how the core gets its defaults (drafter=none, verifier=auto) without importing a
    method."""
    node = OmegaConf.load(Path(CONF_DIR) / group / f"{name}.yaml")
    node.merge_with(values)
    return instantiate(node)


def build_component(node: DictConfig, key: str):
    """``hydra.utils.instantiate`` with config mistakes turned into a `ConfigError`
    naming ``key`` (Hydra wraps whatever the constructor raised). Keys and types were
    checked against the constructor already (`spec_zoo.schema`); what is left is a file
    that cannot be read."""
    try:
        return instantiate(node)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        where = next((f"{key}.{k}" for k in _artefact_keys(node) if isinstance(node.get(k), str)), None)
        if where and isinstance(cause, (OSError, ValueError, KeyError)):
            raise ConfigError(f"{where}: {node.get(where.split('.')[-1])} could not be loaded ({first_line(cause)}); "
                              "point it at a complete, uncorrupted model directory.") from None
        if isinstance(cause, (ImportError, TypeError)):
            raise ConfigError(f"{key}._target_: {node.get('_target_')} could not be built ({first_line(cause)}); "
                              f"check the {key}.* keys against its constructor.") from None
        raise


def _artefact_keys(node: DictConfig) -> tuple[str, ...]:
    """The keys of a component node that name a file its class loads (`Drafter.artefact_keys`)."""
    try:
        built = _class_of(str(node.get("_target_")))
    except (ImportError, AttributeError, ValueError):  # a bad _target_: reported by the caller
        return Drafter.artefact_keys
    return built.artefact_keys if isinstance(built, type) and issubclass(built, Drafter) else Drafter.artefact_keys


def _yaml_about(path: Path) -> str:
    """The first sentence of a YAML option's header comment: what it does, in one line."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words.append(line.lstrip("# ").strip())
    text = " ".join(words)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _class_of(target: str):
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def options() -> list[Option]:
    """Every drafter, verifier and bench method, shipped and installed."""
    from omegaconf import OmegaConf

    out: list[Option] = []
    verifier_lossless: dict[str, bool | None] = {}
    for group in ("drafter", "verifier"):
        for name in shipped_options(group):
            path = Path(CONF_DIR) / group / f"{name}.yaml"
            lossless = None
            if group == "verifier":
                target = cast(DictConfig, OmegaConf.load(path)).get("_target_")
                lossless = verifier_lossless[name] = getattr(_class_of(target), "lossless", None)
            out.append(Option(group, name, _yaml_about(path), "spec-zoo", lossless))
        for name, ep in entry_points(group).items():
            cls = load_plugin(group, ep)
            lossless = verifier_lossless[name] = bool(cls.lossless) if issubclass(cls, Verifier) else None
            about = (inspect.getdoc(cls) or "").split("\n")[0]
            out.append(Option(group, name, about, ep.dist.name if ep.dist else "?", lossless))
    for name in shipped_options("method"):
        path = Path(CONF_DIR) / "method" / f"{name}.yaml"
        cfg = cast(DictConfig, OmegaConf.load(path))
        verifier = cfg.get("verifier")
        lossless = None if cfg.get("engine") == "transformers" else (
            True if verifier is None else verifier_lossless.get(verifier) if isinstance(verifier, str) else None)
        out.append(Option("method", name, _yaml_about(path), "spec-zoo", lossless))
    return out


def format_options(items: list[Option]) -> str:
    """The table ``spec-zoo list`` prints: group, name, lossless, description."""
    rows = []
    for group in ("drafter", "verifier", "method"):
        mine = [o for o in items if o.group == group]
        note = " (lossless under every lossless verifier: drafts record the q they were drawn from)" \
            if group == "drafter" else ""
        rows.append(f"{group}s ({len(mine)}){note}:")
        width = max(len(o.name) for o in mine)
        for o in mine:
            flag = {True: "lossless", False: "LOSSY", None: ""}[o.lossless]
            origin = "" if o.source == "spec-zoo" else f" [plugin: {o.source}]"
            rows.append(f"  {o.name:<{width}}  {flag:<8}  {o.about}{origin}")
    return "\n".join(rows)
