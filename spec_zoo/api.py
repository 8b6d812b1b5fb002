"""Build and run a decoder from the Hydra config: shared by the ``spec-zoo`` CLI and
the Python API `generate`, so ``drafter="ngram"`` means exactly ``spec-zoo drafter=ngram``."""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Sequence
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from spec_zoo.decoder import Output, SpeculativeDecoder
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Drafter, Verifier
from spec_zoo.models import check_model_config, load_target
from spec_zoo.sampling import SamplingParams
from spec_zoo.target import Target

CONF_DIR = str(importlib.resources.files("spec_zoo.conf"))
GENERATION_KEYS = ("top_k", "top_p", "stop_strings", "chat")


def build_component(node: DictConfig, key: str):
    """``hydra.utils.instantiate`` with config mistakes turned into a `ConfigError`
    naming ``key`` (Hydra wraps whatever the constructor raised)."""
    try:
        return instantiate(node)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        if isinstance(cause, (ImportError, TypeError)):
            raise ConfigError(
                f"{key}._target_={node.get('_target_')!r} could not be built ({cause}); check that the "
                f"class is importable and that the {key}.* keys match its constructor arguments."
            ) from None
        raise


def build_decoder(
    cfg: DictConfig,
    target: Target | None = None,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
) -> SpeculativeDecoder:
    """Cheap checks first (missing keys, model section, sampling, verifier, prompt), then
    build the drafter (a draft model may load here), and load the target last, so a bad
    value fails in milliseconds instead of after a model load."""
    if missing := sorted(OmegaConf.missing_keys(cfg)):
        raise ConfigError(f"{', '.join(missing)} must be set, e.g. on the command line as {missing[0]}=VALUE.")
    if target is None:
        check_model_config(cfg.model)
    gen = cfg.generation
    sampling = SamplingParams(temperature=float(gen.temperature), top_k=int(gen.top_k), top_p=float(gen.top_p))
    if int(gen.max_new_tokens) <= 0:
        raise ConfigError(f"generation.max_new_tokens={gen.max_new_tokens}; it must be a positive integer.")
    verifier = verifier or build_component(cfg.verifier, "verifier")
    verifier.check(sampling)
    prompt = cfg.prompt
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()) or len(prompt) == 0:
        raise ConfigError("prompt is empty; pass some text, e.g. prompt='Tell me about bees'.")
    if drafter is None:
        draft_path = cfg.drafter.get("path")
        if isinstance(draft_path, str) and not Path(draft_path).expanduser().is_dir():
            raise ConfigError(
                f"drafter.path={draft_path!r} is not a directory; build the default draft once with "
                "`spec-zoo-make-draft`, or set drafter.path=DIR to a model sharing the target's tokenizer."
            )
        drafter = build_component(cfg.drafter, "drafter")
    if target is None:
        target = load_target(**cfg.model)
    return SpeculativeDecoder(target, drafter, verifier, sampling, seed=int(cfg.seed))


def run(
    cfg: DictConfig, decoder: SpeculativeDecoder, on_text: Callable[[str], None] | None = None
) -> Output:
    """Generate ``cfg.prompt`` with ``decoder`` under ``cfg.generation``."""
    gen = cfg.generation
    prompt = cfg.prompt
    ids = decoder.encode(prompt, chat=bool(gen.chat)) if isinstance(prompt, str) else list(prompt)
    return decoder.generate(ids, int(gen.max_new_tokens), list(gen.stop_strings), on_text=on_text)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config ``spec-zoo <overrides>`` would run with."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def generate(
    prompt: str | Sequence[int],
    drafter: str | Drafter = "none",
    verifier: str | Verifier | None = None,
    model: str | Target = "smollm2-135m",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    overrides: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    **kw,
) -> Output:
    """Speculative generation in one call.

    drafter:   a config name (``"none"``, ``"ngram"``, ``"small_model"``, ...) or a `Drafter`.
    verifier:  a config name, a `Verifier`, or None: greedy at temperature 0, else rejection.
    model:     a config name, a local model dir, or a loaded `Target` (reused, no reload).
    overrides: extra Hydra overrides, as on the command line (``["drafter.max_draft=8"]``).
    kw:        ``top_k``, ``top_p``, ``stop_strings``, ``chat`` (generation keys), ``seed``,
               and any other key as an argument of the named drafter (``num_draft=8``).
    """
    choices = []
    if isinstance(drafter, str):
        choices.append(f"drafter={drafter}")
    if verifier is None:
        verifier = "greedy" if temperature == 0 else "rejection"
    if isinstance(verifier, str):
        choices.append(f"verifier={verifier}")
    model_dir = None
    if isinstance(model, str):
        model_dir = model if Path(model).expanduser().is_dir() else None
        choices.append("model=local" if model_dir else f"model={model}")
    cfg = compose_config(choices + list(overrides))
    values = {"prompt": prompt, "generation.max_new_tokens": max_new_tokens, "generation.temperature": temperature}
    if model_dir:
        values["model.path"] = model_dir
    for key, value in kw.items():
        full = key if key == "seed" else f"generation.{key}" if key in GENERATION_KEYS else f"drafter.{key}"
        values[full] = value
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, force_add=key.startswith("drafter."))
    decoder = build_decoder(
        cfg,
        target=model if isinstance(model, Target) else None,
        drafter=None if isinstance(drafter, str) else drafter,
        verifier=None if isinstance(verifier, str) else verifier,
    )
    return run(cfg, decoder, on_text)
