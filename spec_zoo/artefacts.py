"""Trained artefacts on disk: a directory of safetensors files plus a JSON record, and
the target it was trained for (a fingerprint checked at load time).

Every artefact directory spec-zoo writes (drafts, heads, adapters, converted models) goes
through `write_artefact`: the whole directory atomically (a temp dir, then one rename: an
interrupted save never leaves half an artefact), replacing only a previous artefact, never
the user's files (`check_out_dir`, also called before the work starts). Both judge and write
the directory `spec_zoo.outputs.resolved` (symlinks and ``..`` applied), never the path as typed. Records are read
back with their format and version checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.utils.weak import WeakIdKeyDictionary

from spec_zoo.errors import ConfigError
from spec_zoo.outputs import check_writable, resolved, umask

#: every file an artefact directory may hold: JSON records and configs, safetensors weights,
#: tokenizer files (what ``save_pretrained`` writes). A directory holding anything else is the
#: user's, and is never replaced.
ARTEFACT_FILES = ("*.json", "*.safetensors", "*.jinja", "merges.txt", "tokenizer.model")


def artefact_format(out_dir: Path, record_name: str | None = None) -> str | None:
    """What artefact ``out_dir`` holds: the ``spec-zoo-*`` format its JSON record names (the
    one called ``record_name``, or any), else ``"model"`` for a Hugging Face model dir (a
    ``config.json`` naming a ``model_type``; only when ``record_name`` is None); None when it
    holds anything but artefact files (a subdirectory, another file) or no such record."""
    entries = list(out_dir.iterdir())
    if any(e.is_symlink() or not e.is_file() or not any(e.match(p) for p in ARTEFACT_FILES) for e in entries):
        return None
    records = {e.name: _json_object(e) for e in ([out_dir / record_name] if record_name else entries)}
    formats = [r["format"] for r in records.values()
               if isinstance(r.get("format"), str) and r["format"].startswith("spec-zoo-")]
    if formats:
        return formats[0]
    model = record_name is None and isinstance(records.get("config.json", {}).get("model_type"), str)
    return "model" if model else None


def _json_object(file: Path) -> dict:
    """The JSON object in ``file``, or {} when it is missing, unreadable or not an object."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def check_out_dir(out_dir, record_name: str, fmt: str, key: str, overwrite: bool = False) -> Path:
    """``out_dir`` if an artefact of format ``fmt`` may be written there, else a one-line
    `ConfigError` naming ``key``, the path and the fix. Allowed: a new or empty directory
    (under a writable one), or one holding exactly a previous artefact of the same format
    (its record ``record_name`` says so); with ``overwrite``, any spec-zoo artefact or model
    dir. Never a directory with other files, the current directory or one of its parents.
    Called before the work that makes the artefact, and again just before it is written.
    Returns ``out_dir`` `resolved`: what was judged, and all that may be written."""
    out_dir = resolved(out_dir)
    flag = f"{key.rsplit('.', 1)[0]}.overwrite=true" if "." in key else "--overwrite"
    where, fresh = f"{key}: {str(out_dir)!r}", f"choose a new directory for {key}"
    here = Path.cwd().resolve()
    if out_dir in (here, *here.parents):
        raise ConfigError(f"{where} is the current directory or one of its parents, which is never replaced; "
                          f"{fresh}.")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{where} exists and is not a directory; {fresh}, or move it away.")
    check_writable(out_dir.parent, key)  # the temp dir is made beside out_dir
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return out_dir
    if artefact_format(out_dir, record_name) == fmt:
        return out_dir
    found = artefact_format(out_dir)
    if found is None:
        raise ConfigError(f"{where} already holds other files than a previous {fmt} artefact, which would be "
                          f"lost; {fresh} (a directory with other files is never replaced, even with {flag}).")
    if not overwrite:
        raise ConfigError(f"{where} holds a {found} artefact, not a {fmt} one; {fresh}, or pass {flag} to "
                          "replace it.")
    return out_dir


def write_artefact(out_dir, record_name: str, record: dict, write_files: Callable[[Path], None],
                   key: str = "output.dir", overwrite: bool = False, fmt: str | None = None) -> Path:
    """Create ``out_dir`` with what ``write_files(tmp_dir)`` writes plus ``record_name``, atomically:
    into a temp dir beside it, then one rename. What was there is replaced only when
    `check_out_dir` allows it (checked again here), so an interrupted save never leaves
    half an artefact and a save never deletes the user's files. ``fmt``: the artefact's kind
    (default: the record's ``format``; a published layout, whose record has none, names its own,
    and then only a new or empty directory is written)."""
    out_dir = check_out_dir(out_dir, record_name, fmt or record["format"], key, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    old = tmp.with_name(tmp.name + ".old")
    try:
        write_files(tmp)
        (tmp / record_name).write_text(json.dumps(record, indent=1))
        _usual_modes(tmp)
        if out_dir.exists():  # the previous artefact, checked above: moved aside, then deleted
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return out_dir


#: the dtype trained weights are stored in (the vectors, and the matrices when not quantized): half the bytes of
#: float32, and the shipped artefacts' weights (|w| <= 5.4) sit far inside its range with 3 more mantissa bits than
#: bfloat16; loaders cast to the target's
STORAGE_DTYPE = torch.float16

#: how an artefact's weight matrices (2-D floating tensors) may be stored (`storage_tensors`, ``output.quantize``):
#: None as floats of the storage dtype; "int8" / "int6" / "int5" / "int4" symmetric per group of `GROUP` inputs
#: of a row (a float16 scale per group), the integers bit-packed (8, 6, 5 or 4 bits a weight). A scale per group
#: and not per row: a row reading inputs of unlike sizes (EAGLE's fc over [embedding, feature]) keeps its small
#: ones (per row, int8 moved that head's acceptance at position 3 by 0.04). Vectors (norms, biases) and integer
#: tensors are never quantized. Read back by `restored_tensors`, which also reads the per-row int8 layout
#: (int8 integers, a float32 scale per row) artefacts were written in before.
QUANTIZE = (None, "int8", "int6", "int5", "int4")
GROUP = 64
#: what a trained artefact's matrices are stored as unless ``output.quantize`` says otherwise: a quarter of float32's
#: bytes, and the shipped artefacts' acceptance moves by less than 0.01 a position at it (docs/training.md)
DEFAULT_QUANTIZE = "int8"
#: a quantized matrix ``name`` is stored as ``name`` (the integers), ``name + SCALES`` (its scales) and, when
#: bit-packed, ``name + BITS`` ([bits, input features])
SCALES, BITS = "::scales", "::bits"


def check_quantize(kind, key: str, floats: str = "null") -> None:
    """``kind`` is a storage width of `QUANTIZE`, or a `ConfigError` naming ``key`` and the widths (``floats``:
    the word for float storage where ``key`` is set: null in a config, none on a command line)."""
    if kind not in QUANTIZE:
        raise ConfigError(f"{key}={kind!r}; allowed values: int8, int6, int5, int4, {floats} (floats).")


def storage_tensors(tensors: dict[str, torch.Tensor], dtype: torch.dtype = STORAGE_DTYPE,
                    quantize: str | None = None,
                    widths: dict[str, str | None] | None = None) -> dict[str, torch.Tensor]:
    """``tensors`` as stored: floating ones in ``dtype`` (matrices quantized when ``quantize`` is one
    of `QUANTIZE`, or as ``widths`` names for a matrix of that name: a head's output layer at its
    own width), on the CPU, contiguous; a weight beyond ``dtype``'s finite range is refused (it
    would be stored as inf and refused at load). The one writer of every artefact's weights;
    `restored_tensors` reads what it writes."""
    widths = widths or {}
    for key, kind in (("output.quantize", quantize), *((f"output.quantize for {n}", w) for n, w in widths.items())):
        check_quantize(kind, key)
    out = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu")
        if name.endswith((SCALES, BITS)):
            raise ConfigError(f"{name}: a weight's name may not end in {SCALES!r} or {BITS!r} (stored scales).")
        kind = widths.get(name, quantize)
        if kind and t.is_floating_point() and t.dim() == 2:
            out.update({name + k: v for k, v in _quantized(t.float(), kind).items()})
            continue
        if t.is_floating_point() and t.dtype != dtype:
            cast = t.to(dtype)
            if bool(torch.isfinite(t).all()) and not bool(torch.isfinite(cast).all()):
                raise ConfigError(f"{name} has weights beyond {str(dtype).removeprefix('torch.')}'s range "
                                  f"(max |w| {float(t.abs().max()):.3g}); store the artefact in bfloat16 "
                                  "(output.dtype=bfloat16) or float32.")
            t = cast
        out[name] = t.contiguous()
    return out


def _quantized(w: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
    """The stored parts of the float matrix ``w`` [O, I] (keys: "", `SCALES`, `BITS`): b-bit integers
    offset to 0..2^b - 2, bit-packed row by row (uint8 [O, ceil(I * b / 8)]), with float16 scales
    [O, ceil(I / GROUP)]. Each scale is its group's max |w| / (2^(b-1) - 1), 1 where that is 0."""
    if not bool(torch.isfinite(w).all()):
        raise ConfigError("a weight matrix to quantize holds NaN or infinite values; the training diverged.")
    bits = int(kind.removeprefix("int"))
    top = 2 ** (bits - 1) - 1
    groups = _groups(w)
    peak = groups.abs().amax(2)
    half = torch.where(peak > 0, peak / top, torch.ones_like(peak)).to(torch.float16)
    if bool((half.float() <= 0).any() | ~torch.isfinite(half.float()).all()):
        raise ConfigError(f"a weight matrix is out of float16's range for {kind} scales; store it as floats "
                          "(output.quantize=null).")
    q = (groups / half.float()[..., None]).round().clamp(-top, top).flatten(1)[:, : w.shape[1]].to(torch.int16) + top
    flat = ((q[..., None] >> torch.arange(bits, dtype=torch.int16)) & 1).flatten(1)  # [O, I * bits], low bit first
    flat = torch.nn.functional.pad(flat, (0, -flat.shape[1] % 8)).view(w.shape[0], -1, 8)
    packed = (flat << torch.arange(8, dtype=torch.int16)).sum(2, dtype=torch.int16).to(torch.uint8)
    return {"": packed.contiguous(), SCALES: half.contiguous(), BITS: torch.tensor([bits, w.shape[1]])}


def _groups(w: torch.Tensor) -> torch.Tensor:
    """``w`` [O, I] as [O, G, GROUP] (zero-padded on the right)."""
    pad = -w.shape[1] % GROUP
    return torch.nn.functional.pad(w, (0, pad)).view(w.shape[0], -1, GROUP)


def restored_tensors(tensors: dict[str, torch.Tensor], key: str, path, what: str) -> dict[str, torch.Tensor]:
    """What `storage_tensors` wrote, with each quantized matrix back as float32 (integers x scales);
    everything else as stored. Scales that are not positive and finite, or that do not fit their
    matrix, raise a one-line `ConfigError` (the file is corrupt). Float tensors of an older,
    unquantized artefact pass through unchanged."""
    out = {}
    for name, t in tensors.items():
        if name.endswith((SCALES, BITS)):
            if name.rsplit("::", 1)[0] not in tensors:
                raise ConfigError(f"{key}: {path} holds scales {name!r} of no weight; the {what} is corrupt: "
                                  "retrain or re-copy it.")
            continue
        scales = tensors.get(name + SCALES)
        out[name] = t if scales is None else _dequantized(name, t, scales, tensors.get(name + BITS), key, path, what)
    return out


def _dequantized(name: str, q: torch.Tensor, scales: torch.Tensor, bits: torch.Tensor | None, key: str, path,
                 what: str) -> torch.Tensor:
    bad = f"{key}: {path} has a corrupt quantized weight {name!r} ({{}}); the {what} is corrupt: retrain or re-copy it."
    s = scales.float()
    if not scales.is_floating_point() or not bool((torch.isfinite(s) & (s > 0)).all()):
        raise ConfigError(bad.format("scales not positive and finite"))
    if bits is None and q.dtype == torch.int8 and q.dim() == 2 and tuple(s.shape) == (q.shape[0], 1):
        return q.float() * s
    b, width = (int(x) for x in bits.tolist()) if bits is not None and bits.numel() == 2 else (0, 0)
    if not (q.dtype == torch.uint8 and q.dim() == 2 and 2 <= b <= 8 and q.shape[1] == -(-width * b // 8)
            and s.dim() == 2 and tuple(s.shape) == (q.shape[0], -(-width // GROUP))):
        raise ConfigError(bad.format(f"{str(q.dtype).removeprefix('torch.')} {list(q.shape)} with scales "
                                     f"{list(s.shape)}"))
    flat = ((q[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(1)[:, : width * b]
    flat = flat.view(q.shape[0], width, b).to(torch.int16)
    top = 2 ** (b - 1) - 1
    ints = (flat << torch.arange(b, dtype=torch.int16)).sum(2, dtype=torch.int16) - top
    if bool((ints > top).any()):
        raise ConfigError(bad.format(f"an int{b} value out of range"))
    return (_groups(ints.float()) * s[..., None]).flatten(1)[:, :width].contiguous()


def storage_record(dtype: torch.dtype, quantize: str | None, quantize_head: str | None = None) -> dict:
    """The record fields that say how an artefact's weights are stored (``quantize_head``: its output
    layer's width, where that differs)."""
    return {"dtype": str(dtype).removeprefix("torch."), "quantize": quantize,
            **({"quantize_head": quantize_head} if quantize_head and quantize_head != quantize else {}),
            **({"group": GROUP} if quantize or quantize_head else {})}


def _usual_modes(tmp: Path) -> None:
    """Give the directory and its files the modes of any new file under the user's umask:
    `tempfile.mkdtemp` makes the directory private (0700) and safetensors writes 0600, so
    an artefact would otherwise be unreadable to the other users of a shared model dir."""
    mask = umask()
    os.chmod(tmp, 0o777 & ~mask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~mask)


def read_record(file: Path, fmt: str, version: int, what: str, fix: str) -> dict:
    """The JSON record at ``file``; a corrupt, foreign or too new one raises `ConfigError`."""
    try:
        record = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file} is corrupt ({e}); {fix}.") from None
    if not isinstance(record, dict) or record.get("format") != fmt:
        found = record.get("format") if isinstance(record, dict) else None
        raise ConfigError(f"{file} is not a spec-zoo {what} record (format={found!r}).")
    if int(record.get("format_version", 0)) > version:
        raise ConfigError(f"{file} has format_version {record['format_version']}; this spec-zoo reads up to "
                          f"{version}: upgrade spec-zoo.")
    return record


#: the types of the shape fields a head's record may hold (what each head class's `describe` writes)
RECORD_TYPES = {"train_head": bool, "mlp": bool, "hidden_size": int, "draft_vocab_size": int, "init_layer": int,
                "exit_layer": int, "num_heads": int}


def check_artefact_values(record: dict, tensors: dict, key: str, path, what: str) -> None:
    """Refuse a record field of the wrong type or a weight that is NaN or infinite at load,
    rather than let sampling fail on it later."""
    for field, kind in RECORD_TYPES.items():
        if field in record and type(record[field]) is not kind:  # bool is no int here
            raise ConfigError(f"{key}: {path} records {field}={record[field]!r:.40}, not "
                              f"{'true or false' if kind is bool else 'an integer'}; the {what} is corrupt: retrain "
                              "or re-copy it.")
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ConfigError(f"{key}: {path} has NaN or infinite weights ({', '.join(sorted(bad)[:3])}); the {what} "
                          "is corrupt (a diverged training?): retrain or re-copy it.")


_FP_ROWS, _FP_DIMS = 16, 8


def target_fingerprint(model) -> list[list[float]]:
    """A few entries of the target's input embedding matrix: enough to tell targets apart,
    robust to the dtype the target is loaded in (compared with a tolerance)."""
    w = model.get_input_embeddings().weight.detach()
    rows = torch.linspace(0, w.shape[0] - 1, _FP_ROWS).long()
    return [[round(float(x), 4) for x in w[r, :_FP_DIMS].float()] for r in rows]


def fingerprint_matches(a, b, tol: float = 2e-2) -> bool:
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if ta.shape != tb.shape:
        return False
    scale = max(float(ta.abs().mean()), 1e-6)
    return float((ta - tb).abs().max()) <= tol * max(scale, 1.0) + 1e-3


def describe_target(model, name: str | None) -> dict:
    cfg = model.config
    return {
        "name": name,
        "model_type": getattr(cfg, "model_type", None),
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "hidden_size": int(cfg.hidden_size),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "fingerprint": target_fingerprint(model),
    }


def check_target(record: dict, target_model, path, key: str = "drafter.path",
                 fix: str = "`spec-zoo-train distill target.path=...`, or drafter=small_model for an undistilled draft",
                 ) -> None:
    """Refuse an artefact trained for another target, with a message saying which."""
    want = record.get("target") or {}
    have = describe_target(target_model, None)
    problems = [f"{k} {want.get(k)} vs {have[k]}" for k in ("vocab_size", "hidden_size")
                if want.get(k) is not None and want.get(k) != have[k]]
    if (not problems and want.get("fingerprint") is not None
            and not fingerprint_matches(want["fingerprint"], have["fingerprint"])):
        problems.append("the target's embedding weights differ")
    if problems:
        raise ConfigError(
            f"{key}={str(path)!r} was trained for target {want.get('name')!r}, not for this one "
            f"({'; '.join(problems)}). Use one trained for this target ({fix})."
        )


def sha256(chunks: Iterable[bytes]) -> str:
    """SHA-256 of ``chunks`` in order: the digest an artefact records of what it was made against
    (a base draft's weight files, `spec_zoo.drafters.parallel.model.weights_digest`; a tensor it
    takes from the target, `target_digests`)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


#: a tensor an artefact takes from the target instead of storing it is recorded by its digest in the two
#: dtypes a target's weights are compared in: float16 for a float16 target, bfloat16 for the others (a
#: float32 or bfloat16 load of the same model rounds to the same bfloat16 values)
_DIGEST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _digest_dtype(t: torch.Tensor) -> str:
    return "float16" if t.dtype == torch.float16 else "bfloat16"


_DIGESTS = WeakIdKeyDictionary()  # tensor -> (its version, its digests)


def target_digests(t: torch.Tensor) -> dict[str, str]:
    """The record of a tensor the artefact takes from the target (never stores): its SHA-256 as rounded to
    each of `_DIGEST_DTYPES`; `check_from_target` compares the one of the dtype the target is loaded in.
    Kept per tensor until it changes (a target's embedding table is checked by every draft loaded on it)."""
    version, digests = _DIGESTS.get(t, (None, None))
    if digests is None or version != t._version:
        flat = t.detach().to("cpu").contiguous()
        digests = {name: sha256([flat.to(dtype).view(torch.int16).numpy().tobytes()])
                   for name, dtype in _DIGEST_DTYPES.items()}
        _DIGESTS[t] = (t._version, digests)
    return digests


def check_from_target(record: dict, tensors: dict[str, torch.Tensor], key: str, path, what: str, fix: str) -> None:
    """Refuse, in one line, an artefact whose record names a tensor taken from the target
    (``from_target``: name -> `target_digests`) that this target's ``tensors[name]`` does not match:
    the target's weights differ from those the artefact was made with. Records without one pass."""
    for name, want in (record.get("from_target") or {}).items():
        t = tensors.get(name)
        kind = _digest_dtype(t) if t is not None else "bfloat16"
        if not isinstance(want, dict) or t is None or want.get(kind) != target_digests(t)[kind]:
            raise ConfigError(f"{key}={str(path)!r} takes {name} from the target, but this target's {name} differ "
                              f"from those the {what} was made with (SHA-256 of its {kind} values); use one made "
                              f"for this target ({fix}).")
