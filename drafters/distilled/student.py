"""The distilled draft model ("student") and its artefact directory.

A student is a Llama-family causal LM sharing the target's tokenizer. Two input modes:

* ``input_embeddings="target"`` (the default, initialised from the target): the student
  reads the target's own input embeddings (frozen, never stored twice: at decode time
  the drafter plugs the target's embedding module in). Its LM head may cover a reduced
  *draft vocabulary* (the most frequent tokens of the teacher data): logits exist only
  for those ids, so q is exactly zero elsewhere and exact verification stays exact.
* ``input_embeddings="own"``: an existing HF model used as is (full vocabulary).

Artefact: an HF model directory, ``config.json`` + ``model.safetensors`` (a Llama whose
``vocab_size`` is the draft vocabulary size, ``lm_head`` the trained head) + ``distill.json``:
the record of the target it was distilled from (name, sizes, an embedding fingerprint), the
draft vocabulary (token ids in the target's vocabulary, row order of the head), how the weights
are stored, the data, the loss, the steps and the measured alpha. Format version 2 (written
now): the weights as `spec_zoo.artefacts.storage_tensors` writes them (matrices quantized,
``quantize``), and a draft that reads the target's embeddings stores none: the record holds their
digest (``from_target``), checked when the target's are plugged in; it loads with `load_artefact`,
not ``AutoModelForCausalLM``. Version 1 (read too): float16 weights with ``embed_tokens``, the
target's rows of the draft vocabulary, a plain HF model dir.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import (
    DEFAULT_QUANTIZE,
    check_artefact_values,
    check_from_target,
    check_target,
    restored_tensors,
    storage_record,
    storage_tensors,
    target_digests,
    write_artefact,
)
from spec_zoo.artefacts import read_record as read_json_record
from spec_zoo.errors import ConfigError

RECORD = "distill.json"
FORMAT = "spec-zoo-distilled-draft"
FORMAT_VERSION = 2
WEIGHTS = "model.safetensors"
HEAD = "lm_head.weight"  # its output layer (`save_artefact`'s quantize_head)
EMBED = "model.embed_tokens.weight"  # not stored when the draft reads the target's embeddings (version 2)


class Student(torch.nn.Module):
    """``lm`` (a causal LM over the draft vocabulary) plus how it reads its input.

    vocab_ids: LongTensor [K] (target token id of each head row) or None (full vocabulary).
    embed:     the target's input embedding module when ``input_embeddings == "target"``.
    """

    def __init__(self, lm, vocab_ids: torch.Tensor | None, embed=None):
        super().__init__()
        self.lm = lm
        self.vocab_ids = vocab_ids
        self.embed = [embed]  # a list: not a submodule (frozen, not trained, not saved)

    @property
    def input_embeddings(self) -> str:
        return "own" if self.embed[0] is None else "target"

    def base(self):
        lm = self.lm
        return lm.get_base_model() if hasattr(lm, "get_base_model") else lm

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [B, L, H] of right-padded ``ids``."""
        body = self.base().model
        if self.embed[0] is not None:
            return body(inputs_embeds=self.embed[0](ids), attention_mask=attention_mask,
                        use_cache=False).last_hidden_state
        return body(input_ids=ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return self.base().lm_head(hidden)

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.vocab_ids is None else self.vocab_ids.to(index.device)[index]


def student_from_target(target_model, layers: int, copy_layers, vocab_ids: torch.Tensor | None,
                        random_layers: bool = False, seed: int = 0) -> Student:
    """A ``layers``-layer Llama of the target's width: layers copied from the target's
    ``copy_layers`` (default: the first ones), final norm copied, LM head rows copied from
    the target's output embeddings for ``vocab_ids``; inputs read the target's embeddings."""
    from transformers import AutoModelForCausalLM

    total = target_model.config.num_hidden_layers
    copy_layers = list(range(layers)) if copy_layers is None else [int(i) for i in copy_layers]
    if layers < 1 or len(copy_layers) != layers or not all(0 <= i < total for i in copy_layers):
        raise ConfigError(
            f"student.layers={layers}, student.copy_layers={copy_layers}: need layers >= 1 and one target "
            f"layer index in [0, {total - 1}] per student layer (or copy_layers=null for the first ones)."
        )
    config = copy.deepcopy(target_model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in copy_layers]
    full_vocab = target_model.get_output_embeddings().weight.shape[0]
    config.vocab_size = full_vocab if vocab_ids is None else int(vocab_ids.numel())
    config.tie_word_embeddings = False
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    src = {k: v.float() for k, v in target_model.state_dict().items()}
    rows = slice(None) if vocab_ids is None else vocab_ids
    state = {
        "model.embed_tokens.weight": target_model.get_input_embeddings().weight.detach().float()[rows],
        "lm_head.weight": target_model.get_output_embeddings().weight.detach().float()[rows],
        "model.norm.weight": src["model.norm.weight"],
    }
    if not random_layers:
        for new, old in enumerate(copy_layers):
            prefix = f"model.layers.{old}."
            state.update({f"model.layers.{new}." + k[len(prefix):]: v for k, v in src.items() if k.startswith(prefix)})
    _, unexpected = lm.load_state_dict(state, strict=False)
    if unexpected:
        raise ConfigError(f"cannot copy target weights into the student (unexpected keys {unexpected[:3]}); "
                          "is the target a Llama-family model?")
    lm.generation_config = copy.deepcopy(target_model.generation_config)
    return Student(lm.eval(), vocab_ids, target_model.get_input_embeddings())


def student_from_pretrained(path, target_model=None) -> tuple[Student, dict | None]:
    """An existing draft: a distilled artefact (keeps its draft vocabulary, reads the
    target's embeddings) or any HF causal LM sharing the tokenizer (full vocabulary)."""
    path = Path(path).expanduser()
    if (path / RECORD).is_file():
        lm, _, record = load_artefact(path)
        vocab = record.get("draft_vocab")
        vocab_ids = torch.tensor(vocab, dtype=torch.long) if vocab is not None else None
        embed = None
        if record.get("input_embeddings") == "target":
            if target_model is None:
                raise ConfigError(f"{path} reads the target's embeddings; load the target first.")
            check_target(record, target_model, path)
            embed = target_model.get_input_embeddings()
            check_embeddings(record, embed, "drafter.path", path)
        return Student(lm.float(), vocab_ids, embed), record
    from spec_zoo.models import load_causal_lm

    lm, _ = load_causal_lm(path, key="student")
    return Student(lm.float(), None, None), None


def check_embeddings(record: dict, embed, key: str, path) -> None:
    """Refuse target embeddings other than those the draft was distilled with (their digest, version 2)."""
    check_from_target(record, {"input_embeddings": embed.weight}, key, path, "distilled draft",
                      "`spec-zoo-train distill target.path=...`")


def save_artefact(student: Student, out_dir, record: dict, dtype: str = "float16", tokenizer=None,
                  overwrite: bool = False, quantize: str | None = DEFAULT_QUANTIZE,
                  quantize_head: str | None = None) -> Path:
    """Write the model dir + ``distill.json`` with `write_artefact` (atomic; replaces only a previous
    artefact): the weights through `storage_tensors` (vectors in ``dtype``, matrices quantized as
    ``quantize`` says, the output layer as ``quantize_head`` when given), without the target's
    embeddings when the draft reads those."""
    from spec_zoo.models import DTYPES

    lm = student.lm
    if hasattr(lm, "merge_and_unload"):  # a LoRA student: fold the adapters in
        lm = copy.deepcopy(lm).merge_and_unload()
    state = {k: v for k, v in lm.state_dict().items() if not (student.embed[0] is not None and k == EMBED)}
    tensors = storage_tensors(state, DTYPES[dtype], quantize, {HEAD: quantize_head} if quantize_head else None)
    taken = {} if student.embed[0] is None else {"input_embeddings": target_digests(student.embed[0].weight)}
    config = copy.deepcopy(lm.config)
    config.dtype = dtype

    def write_files(tmp: Path) -> None:
        config.save_pretrained(tmp)
        lm.generation_config.save_pretrained(tmp)
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    full = {
        "format": FORMAT, "format_version": FORMAT_VERSION, **storage_record(DTYPES[dtype], quantize, quantize_head),
        "input_embeddings": student.input_embeddings,
        "draft_vocab": None if student.vocab_ids is None else student.vocab_ids.tolist(),
        **({"from_target": taken} if taken else {}),
        **record,
    }
    return write_artefact(out_dir, RECORD, full, write_files, overwrite=overwrite)


def read_record(path) -> dict:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"drafter.path={str(path)!r} is not a directory; point it at a distilled draft "
                          "(made by `spec-zoo-train distill`), or drop it to use the shipped one.")
    file = path / RECORD
    if not file.is_file():
        raise ConfigError(f"drafter.path={str(path)!r} has no {RECORD}: it is not a distilled draft. "
                          "Use drafter=small_model for a plain draft model, or make one with `spec-zoo-train distill`.")
    return read_json_record(file, FORMAT, FORMAT_VERSION, "distilled-draft", "retrain or re-copy the draft")


def load_artefact(path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer or None, record) of a distilled draft dir; corrupt or inconsistent
    files raise `ConfigError` naming the file. A version-2 draft that reads the target's
    embeddings has none of its own until they are plugged in (zeros until then)."""
    from spec_zoo.models import load_causal_lm

    path = Path(path).expanduser()
    record = read_record(path)
    try:
        if int(record.get("format_version", 1)) >= 2:
            model, tokenizer = _load_stored(path, record, dtype, device)
        else:  # version 1: a plain HF model dir, float16, with the target's embedding rows
            model, tokenizer = load_causal_lm(path, dtype=dtype, device=device, key="drafter")
    except ConfigError:
        raise
    except Exception as e:  # truncated/corrupt safetensors, bad config.json, ...
        raise ConfigError(f"drafter.path={str(path)!r}: the model files cannot be loaded ({type(e).__name__}: "
                          f"{str(e)[:200]}); the checkpoint is corrupt or incomplete: retrain or re-copy it.") from None
    check_artefact_values({}, dict(model.state_dict()), "drafter.path", path, "distilled draft")
    rows = model.get_output_embeddings().weight.shape[0]
    vocab = record.get("draft_vocab")
    expected = len(vocab) if vocab is not None else (record.get("target") or {}).get("vocab_size", rows)
    if rows != expected:
        raise ConfigError(f"drafter.path={str(path)!r}: the LM head has {rows} rows but {RECORD} lists "
                          f"{expected} draft tokens; the files do not belong together: retrain or re-copy the draft.")
    return model, tokenizer, record


def _load_stored(path: Path, record: dict, dtype: str, device: str):
    """(model, tokenizer or None) of a version-2 draft: its config, its weights restored
    (`restored_tensors`) in ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from spec_zoo.models import DTYPES, resolve_device

    config = AutoConfig.from_pretrained(path)
    tensors = restored_tensors(load_file(str(path / WEIGHTS)), "drafter.path", path, "distilled draft")
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    own = set(model.state_dict())
    taken = {EMBED} if record.get("input_embeddings") == "target" else set()
    missing, unexpected = sorted(own - set(tensors) - taken), sorted(set(tensors) - own)
    if missing or unexpected:
        raise ConfigError(f"drafter.path={str(path)!r}: {WEIGHTS} does not match its config.json (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}); retrain or re-copy the draft.")
    try:
        with torch.no_grad():
            model.load_state_dict(tensors, strict=False)
            if taken:  # the target's, plugged in by the drafter (`DistilledDrafter.attach`, `Student`)
                model.get_input_embeddings().weight.zero_()
    except RuntimeError as e:
        raise ConfigError(f"drafter.path={str(path)!r}: the weights do not fit its config.json ({str(e)[:160]}); "
                          "retrain or re-copy the draft.") from None
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    has_tokenizer = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    tokenizer = AutoTokenizer.from_pretrained(path) if has_tokenizer else None
    return model.to(resolve_device(device)).eval(), tokenizer
