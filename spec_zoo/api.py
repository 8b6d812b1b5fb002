"""Build and run a decoder from the Hydra config: shared by the ``spec-zoo`` CLI and
the Python API `generate`, so ``drafter="ngram"`` means exactly ``spec-zoo drafter=ngram``."""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from spec_zoo.auto import AutoChoice, choose
from spec_zoo.batch_policy import batch_policy
from spec_zoo.costs import cached_table
from spec_zoo.decoder import Output, SpeculativeDecoder, refuse_empty
from spec_zoo.errors import ConfigError, first_line
from spec_zoo.interfaces import Drafter, Verifier
from spec_zoo.models import check_model_config, load_target
from spec_zoo.registry import build_component, compose, option_names, register_plugins
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from spec_zoo.schema import constructor_params, fail, locate, validate

GENERATION_KEYS = ("top_k", "top_p", "stop_strings", "chat")


def check_model_dir(path: str, key: str = "model.path") -> None:
    """A local model dir must hold a readable config.json and safetensors weights: checked
    before loading, so an empty or half-copied dir gives one line instead of a traceback."""
    import json

    folder = Path(path).expanduser()
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path} has no config.json; point it at a Hugging Face model dir "
                          "(config.json + *.safetensors).") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{key}: {path}/config.json is not valid JSON ({first_line(err)}); "
                          "re-download or re-save the model.") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(f"{key}: {path}/config.json has no model_type; it is not a Hugging Face model config.")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ConfigError(f"{key}: {path} has no *.safetensors weights; save the model with "
                          "save_pretrained(..., safe_serialization=True).")
    from safetensors import safe_open

    for file in weights:
        try:
            with safe_open(str(file), "pt") as f:
                f.keys()
        except Exception as err:  # safetensors raises its own error type for any corruption
            raise ConfigError(f"{key}: {file.name} in {path} is not a readable safetensors file "
                              f"({first_line(err)}); re-download or re-save the model.") from None


def load_checked_target(model_cfg) -> Target:
    """`load_target` with the dir checked first and a failed load named after ``model.path``."""
    path = model_cfg.get("path")
    if path is not None:
        check_model_dir(str(path))
    try:
        return load_target(**model_cfg)
    except (OSError, ValueError, KeyError) as err:
        if isinstance(err, ConfigError) or path is None:
            raise
        raise ConfigError(f"model.path: {path} could not be loaded ({first_line(err)}); "
                          "point it at a complete Hugging Face model dir.") from None


def read_prompt(cfg: DictConfig) -> str | list[int]:
    """The prompt to run: the text of ``prompt_file`` when set (it replaces ``prompt``), else
    ``prompt``; ``prompt=-`` is read from stdin once (both here, so ``cfg.prompt`` then holds it);
    either at most `spec_zoo.inputs.PROMPT_BYTES`."""
    from spec_zoo.inputs import PROMPT_BYTES, read_stdin, read_utf8

    if cfg.get("prompt_file") is not None:
        text = read_utf8(cfg.prompt_file, "prompt_file", PROMPT_BYTES)
        if not text.strip():
            raise fail("prompt_file", f"{cfg.prompt_file} is empty", "put the prompt text in it")
        cfg.prompt = text
    elif cfg.prompt == "-":
        cfg.prompt = read_stdin("prompt=-", PROMPT_BYTES)
    return cfg.prompt


def build_decoder(
    cfg: DictConfig,
    target: Target | None = None,
    drafter: Drafter | None = None,
    verifier: Verifier | None = None,
    prompts: Sequence[str | list[int]] | None = None,
) -> SpeculativeDecoder:
    """Cheap checks first (missing keys, types and ranges, model section, sampling, verifier,
    prompt), then build the drafter (a draft model may load here), and load the target last,
    so a bad value fails in milliseconds instead of after a model load. ``drafter=auto`` loads
    the target first and calibrates on ``prompts`` (default: ``cfg.prompt``; `choose_drafter`)."""
    if missing := sorted(OmegaConf.missing_keys(cfg)):
        raise ConfigError(f"{missing[0]}: must be set; give it on the command line, e.g. {missing[0]}=VALUE.")
    validate(cfg, "config")
    if target is None:
        check_model_config(cfg.model)
    gen = cfg.generation
    sampling = SamplingParams(temperature=float(gen.temperature), top_k=gen.top_k, top_p=float(gen.top_p))
    verifier = verifier or build_component(cfg.verifier, "verifier")
    verifier.check(sampling)
    refuse_empty(read_prompt(cfg))
    policy = batch_policy(cfg.get("batch_policy"))
    if drafter is None:
        draft_path = cfg.drafter.get("path")
        if isinstance(draft_path, str) and not Path(draft_path).expanduser().is_dir():
            raise ConfigError(
                f"drafter.path: {draft_path!r} is not a directory; build the default draft once with "
                "`spec-zoo-make-draft`, or set drafter.path=DIR to a model sharing the target's tokenizer."
            )
        drafter = build_component(cfg.drafter, "drafter")
    if isinstance(drafter, AutoChoice):
        if not verifier.lossless:
            raise fail("drafter", f"auto prices lossless methods only, but verifier={verifier.name} is lossy",
                       "use verifier=auto (greedy or rejection) with drafter=auto, or name the drafter")
        target = target or load_checked_target(cfg.model)
        drafter = choose_drafter(cfg, drafter, target, verifier, sampling, [cfg.prompt] if prompts is None else prompts)
    if target is None:
        target = load_checked_target(cfg.model)
    decoder = SpeculativeDecoder(target, drafter, verifier, sampling, seed=cfg.seed, cost_table=cached_table(target),
                                 batch_policy=policy)
    check_room(decoder, [cfg.prompt] if prompts is None else prompts, gen)
    compile_ahead(decoder)
    return decoder


def check_room(decoder: SpeculativeDecoder, prompts: Sequence[str | list[int]], gen) -> None:
    """Every prompt is one the target reads, and on the compiled runtime it and its ``max_new_tokens``
    fit the static cache (``model.max_cache_len``): checked once the tokenizer is there and before any
    graph compiles or lock is taken, so a generation the cache would cut short is refused, never
    returned short. A prompt of a ``prompts_file`` is named by its line (`spec_zoo.batch_run.Prompts.where`).
    An eager target refuses a too-long prompt as it starts (no compile to wait for); text for a target
    without a tokenizer is left to `generate`, which refuses it (a decoder may be built for token ids)."""
    from spec_zoo.runtime import CompiledTarget

    compiled, where = isinstance(decoder.target, CompiledTarget), getattr(prompts, "where", None)
    limit = decoder.target.max_length
    for i, prompt in enumerate(prompts):
        name = where(i) if where else "prompt"
        if isinstance(prompt, str) and decoder.target.tokenizer is None:
            continue
        try:
            ids = decoder.encode(prompt if isinstance(prompt, str) else list(prompt), chat=gen.chat)
        except ConfigError as err:
            raise ConfigError(f"{name}: {err}" if where else str(err)) from None
        need = len(ids) + gen.max_new_tokens
        if compiled and limit is not None and need > limit:
            fix = (f"lower generation.max_new_tokens to {limit - len(ids)}, or shorten the prompt"
                   if len(ids) < limit else "shorten the prompt")
            raise ConfigError(f"{name}: {len(ids)} prompt tokens + generation.max_new_tokens={gen.max_new_tokens} "
                              f"need {need} positions, but the target holds {limit} ({decoder.target.context_limit}); "
                              f"{fix}.")


def choose_drafter(cfg: DictConfig, auto: AutoChoice, target: Target, verifier: Verifier, sampling: SamplingParams,
                   prompts: Sequence[str | list[int]]) -> Drafter:
    """The drafter `spec_zoo.auto.choose` picks, built exactly as ``drafter=<choice>`` would be
    (with auto's ``params`` for it): ``cfg.drafter`` becomes that option (so the run's label and
    later builds from ``cfg`` see it), and each candidate is calibrated through this module's own
    `build_decoder`."""

    def build(name: str) -> SpeculativeDecoder:
        trial = cfg.copy()
        with open_dict(trial):
            trial.drafter = auto.option(name)
        return build_decoder(trial, target=target, verifier=verifier)

    encoder = SpeculativeDecoder(target, verifier=verifier, sampling=sampling)  # plain: it only encodes
    choice = choose(auto, target, prompts, lambda p: encoder.encode(p, chat=cfg.generation.chat), build,
                    sampling.temperature)
    with open_dict(cfg):
        cfg.drafter = auto.option(choice)
    return build_component(cfg.drafter, "drafter")


def compiled_parts(decoder: SpeculativeDecoder) -> list[tuple[str, object]]:
    """(name, part) of what runs compiled: the target on the compiled runtime, and the drafter's
    compiled draft models or heads (attached: loaded)."""
    parts = [("target", decoder.target)] if hasattr(decoder.target, "warm_up") else []
    return parts + [("draft", part) for part in getattr(decoder.drafter, "compiled_parts", list)()]


def compile_ahead(decoder: SpeculativeDecoder) -> str | None:
    """Compile every `compiled_parts` now, before anything is timed (what ``spec-zoo warmup`` does),
    so the first decode's figures are decoding only; a part compiled before costs nothing. Returns
    one line saying how long each took and whether inductor's on-disk cache served it (None: nothing
    runs compiled)."""
    said = []
    for name, part in compiled_parts(decoder):
        seconds = part.warm_up()  # type: ignore[attr-defined]
        served = "from inductor's on-disk cache" if part.compile_cached else "compiled afresh"  # type: ignore
        said.append(f"{name} {seconds:.1f} s ({served})")
    return f"compile: {', '.join(said)}; before decoding, in none of the figures above" if said else None


def label(cfg: DictConfig, decoder: SpeculativeDecoder, drafter_choice: str | None) -> str:
    """``drafter=<option> verifier=<name>`` as the user chose them: the option name
    (``small_model_tree``, not the class's ``small_model``) unless ``drafter._target_``
    points elsewhere, then the class's ``name``; an automatic verifier says so, and weights other than
    dense (``model.weights``) are named, as is what each of ``model.runtime``, ``dtype`` and ``weights``
    given as ``auto`` became (`spec_zoo.runtime.host_fit`)."""
    drafter = decoder.drafter.name
    if drafter_choice and option_target(drafter_choice) == cfg.drafter.get("_target_"):
        drafter = drafter_choice
    verifier = decoder.verifier.name
    if getattr(decoder.verifier, "auto", False):
        verifier += f" (auto: temperature {decoder.sampling.temperature:g})"
    if not decoder.verifier.lossless:
        verifier += " (LOSSY: not an exact sample of the target)"
    target = getattr(decoder, "target", None)
    auto, weights = getattr(target, "auto", {}), getattr(target, "weights", "dense")  # int8 / int4: another model
    named = [f"{key}={value} (auto)" for key, value in auto.items()]
    return " ".join([f"drafter={drafter} verifier={verifier}", *named,
                     *([f"weights={weights}"] if weights != "dense" and "weights" not in auto else [])])


@functools.cache
def option_target(choice: str) -> str | None:
    """The ``_target_`` a shipped drafter option builds."""
    return compose_config([f"drafter={choice}"]).drafter.get("_target_")


def run(
    cfg: DictConfig, decoder: SpeculativeDecoder, on_text: Callable[[str], None] | None = None
) -> Output:
    """Generate ``cfg.prompt`` with ``decoder`` under ``cfg.generation``."""
    gen = cfg.generation
    prompt = cfg.prompt
    ids = decoder.encode(prompt if isinstance(prompt, str) else list(prompt), chat=gen.chat)
    return decoder.generate(ids, gen.max_new_tokens, gen.stop_strings, on_text=on_text)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config ``spec-zoo <overrides>`` would run with."""
    register_plugins()
    return compose("config", list(overrides))


def generate(
    prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
    drafter: str | Drafter = "none",
    verifier: str | Verifier | None = None,
    model: str | Target = "smollm2-135m",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    overrides: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    batch_size: int | None = None,
    **kw,
) -> Output | list[Output]:
    """Speculative generation in one call.

    prompt:    text or token ids; or a list of them, a batch: one `Output` each, in order, each
               exactly what that prompt gives alone (`SpeculativeDecoder.generate_batch`,
               ``batch_size`` at a time; docs/batching.md).

    drafter:   a config name (``"none"``, ``"ngram"``, ``"small_model"``, ...) or a `Drafter`.
    verifier:  a config name, a `Verifier`, or None (``"auto"``): greedy at temperature 0, else rejection.
    model:     a config name, a local model dir, or a loaded `Target` (reused, no reload).
    overrides: extra Hydra overrides, as on the command line (``["drafter.max_draft=8"]``).
    kw:        ``top_k``, ``top_p``, ``stop_strings``, ``chat`` (generation keys), ``seed``,
               and any other key as an argument of the named drafter (``num_draft=8``).
    """
    choices = [_choice("drafter", drafter, Drafter),
               _choice("verifier", "auto" if verifier is None else verifier, Verifier)]
    model_dir = None
    if isinstance(model, str):
        model_dir = model if Path(model).expanduser().is_dir() else None
        choices.append("model=local" if model_dir else f"model={model}")
    elif not isinstance(model, Target):
        raise fail("model", f"{model!r} is not a model name, a model dir or a Target", "e.g. model='smollm2-135m'")
    if isinstance(overrides, str):
        raise fail("overrides", "a single string, not a list", f"pass a list, e.g. overrides=[{overrides!r}]")
    cfg = compose_config([c for c in choices if c] + list(overrides))
    if isinstance(prompt, (list, tuple)) and not prompt:
        raise fail("prompt", "an empty list holds no prompt and no token id",
                   "pass text, token ids, or a list of prompts, e.g. ['Tell me about bees']")
    batch = _batch(prompt)
    values = {"prompt": batch[0] if batch else prompt, "generation.max_new_tokens": max_new_tokens,
              "generation.temperature": temperature}
    if model_dir:
        values["model.path"] = model_dir
    drafter_keys = _drafter_keys(cfg, drafter)
    for key, value in kw.items():
        if key == "seed" or key in GENERATION_KEYS:
            values[key if key == "seed" else f"generation.{key}"] = value
        elif key in drafter_keys:
            values[f"drafter.{key}"] = value
        else:
            known = [*inspect.signature(generate).parameters, "seed", *GENERATION_KEYS, *drafter_keys]
            close = difflib.get_close_matches(key, [k for k in known if k != "kw"], n=1)
            raise fail(key, "not an argument of spec_zoo.generate, a generation key or a key of "
                       f"drafter={drafter if isinstance(drafter, str) else type(drafter).__name__}",
                       f"did you mean {close[0]}?" if close else f"the drafter's keys are: {', '.join(drafter_keys)}")
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, force_add=key.startswith("drafter."))
    with quiet_loading():
        decoder = build_decoder(
            cfg,
            target=model if isinstance(model, Target) else None,
            drafter=None if isinstance(drafter, str) else drafter,
            verifier=None if isinstance(verifier, str) or verifier is None else verifier,
            prompts=batch,
        )
    if batch is None:
        return run(cfg, decoder, on_text)
    gen = cfg.generation
    ids = [decoder.encode(p if isinstance(p, str) else list(p), chat=gen.chat) for p in batch]
    return decoder.generate_batch(ids, gen.max_new_tokens, gen.stop_strings, batch_size=batch_size)


def _batch(prompt) -> list | None:
    """The prompts of a batch (a non-empty list of texts or id lists), None for one prompt."""
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, (str, list, tuple)) for p in prompt):
        return list(prompt)
    return None


def _choice(group: str, value, cls: type) -> str | None:
    """The override selecting ``value`` of ``group`` (an option name), None for an instance."""
    if isinstance(value, cls):
        return None
    options = option_names(group)
    if not isinstance(value, str) or value not in options:
        raise fail(group, f"{value!r} is not an option",
                   f"choose one of {', '.join(options)}, or pass a {cls.__name__}")
    return f"{group}={value}"


def _drafter_keys(cfg: DictConfig, drafter) -> list[str]:
    """Keyword arguments `generate` may route to the named drafter's constructor."""
    if not isinstance(drafter, str):
        return []
    params = constructor_params(locate("drafter", cfg.drafter.get("_target_")))
    return sorted(params) if params is not None else sorted(cfg.drafter.keys())


@contextlib.contextmanager
def quiet_loading():
    """No transformers progress bars or load reports while models load (they would mix with
    a caller's output); the caller's logging settings come back afterwards."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
