"""Trained draft heads that live next to the target, and their artefact format.

`VocabHead` is what every such head shares (the Medusa heads, `spec_zoo.drafters.medusa.heads`,
use it alone): a head over a reduced *draft vocabulary* and the artefact files. `StagedHead`
adds stages applied in sequence, each reading what the stage before it left and the token
drafted before it (the MLP speculator, `spec_zoo.drafters.mlp_speculator.speculator`, and the
Hydra heads, `spec_zoo.drafters.hydra.heads`; drafted by `spec_zoo.staged`). `BlockHead`
adds one decoder layer + norm; it is shared by the exit adapter (reads layer E's states,
`spec_zoo.drafters.early_exit.adapter`) and the EAGLE-style feature head (reads the target's
last-layer features, `spec_zoo.drafters.eagle.head`):

* ``block``: one decoder layer of the target's own class, initialised from one of its
  layers (attention + MLP, or attention only); it has its own KV cache, so it sees the
  whole context, not just the current position;
* ``norm``: a copy of the target's final norm;
* a head over a reduced *draft vocabulary* (the most frequent tokens of the training
  data): logits exist only there, so q is exactly zero elsewhere and exact verification
  stays exact. The head rows are the target's (frozen, not stored) unless trained.

It never touches the target's weights or caches, so a lossless verifier stays lossless.

On disk: ``WEIGHTS`` (safetensors: the trained parts and the draft vocabulary) and
``RECORD`` (JSON: shapes, the target it was trained for with an embedding fingerprint, the
training record). Loading refuses another target or files that do not fit together.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import (
    DEFAULT_QUANTIZE,
    STORAGE_DTYPE,
    check_artefact_values,
    check_from_target,
    check_target,
    read_record,
    restored_tensors,
    storage_record,
    storage_tensors,
    target_digests,
    write_artefact,
)
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack
from spec_zoo.runtime.quant_gemm import as_dense

if TYPE_CHECKING:
    from typing import Self


class VocabHead(torch.nn.Module):
    """A head over the draft vocabulary: the target's LM-head rows of ``vocab_ids``
    (frozen and not stored, rebuilt at load) or a trained copy (``train_head``, stored).

    vocab_ids:  LongTensor [K] of target token ids (row order of the head), or None (all).
    Subclasses name their artefact files and implement `describe` and `from_record`.
    """

    #: artefact format name, JSON record and weights file names, and what to call it in errors
    FORMAT, RECORD, WEIGHTS, WHAT = "", "", "", ""
    #: 2: weight matrices may be quantized (``quantize``, `spec_zoo.artefacts.storage_tensors`) and the
    #: target's LM-head rows an untrained head uses are recorded by digest (``from_target``); 1 (read too): float16
    FORMAT_VERSION = 2
    vocab_ids: torch.Tensor | None  # a buffer
    head: torch.Tensor  # a parameter when trained, else a buffer
    record: dict  # what `load_head` read

    def __init__(self, target_model, vocab_ids: torch.Tensor | None = None, train_head: bool = False):
        super().__init__()
        self.train_head = train_head
        weight = target_model.lm_head.weight.detach()
        if vocab_ids is not None:
            vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
            weight = weight[vocab_ids.to(weight.device)]
        self.register_buffer("vocab_ids", vocab_ids)
        if train_head:
            self.head = torch.nn.Parameter(weight.clone())
        else:  # the target's rows, rebuilt at load: not stored
            self.register_buffer("head", weight.clone(), persistent=False)

    def describe(self) -> dict:
        return {"train_head": self.train_head, "hidden_size": int(self.head.shape[1]),
                "draft_vocab_size": int(self.head.shape[0])}

    @classmethod
    def from_record(cls, target_model, record: dict, vocab_ids: torch.Tensor | None) -> Self:
        """An untrained head of the shape ``record`` describes (its weights are loaded next)."""
        raise NotImplementedError


class StagedHead(VocabHead):
    """Draft heads that run in sequence on the target's last hidden state h: ``start(h)`` is
    the state before stage 0; stage i (`advance`) reads the previous stage's state and the
    embedding of the token drafted before it (stage 0: the last committed token) and its
    `logits` guess the token after that one. The token embeddings are the target's own
    (frozen, shared, never stored).

    Subclasses implement `start`, `advance` and `logits` on batches
    ([N, ...] states, [N] tokens), so a tree expands all the nodes of a level at once.
    """

    def __init__(self, target_model, num_stages: int, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        super().__init__(target_model, vocab_ids, train_head)
        self.num_stages = int(num_stages)
        self._embeddings = [target_model.get_input_embeddings()]  # a list: the target is not a submodule

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings of ``tokens`` [N] -> [N, H], scaled to unit RMS: the
        target's rows are small next to its final states, and a token's part should weigh
        as much as the state's from the first training step."""
        e = self._embeddings[0](tokens.to(self.head.device)).to(self.head.dtype)
        return e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        """The state before stage 0, from the target's last-layer states [N, H]."""
        raise NotImplementedError

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Stage ``stage``'s state from the state before it and the tokens [N] drafted before it."""
        raise NotImplementedError

    def logits(self, stage: int, state: torch.Tensor) -> torch.Tensor:
        """Stage ``stage``'s logits [N, V_draft] (its guess of the token after its input token)."""
        raise NotImplementedError


class BlockHead(VocabHead):
    """States [B, q, H] -> one decoder layer -> norm -> logits over the draft vocabulary.

    init_layer: the target layer the block starts as a copy of.
    """

    def __init__(self, target_model, init_layer: int, mlp: bool = True, vocab_ids: torch.Tensor | None = None,
                 train_head: bool = False):
        super().__init__(target_model, vocab_ids, train_head)
        stack = DecoderStack(target_model)
        if not 0 <= init_layer < stack.num_layers:
            raise ConfigError(f"init_layer={init_layer}; the target has layers 0..{stack.num_layers - 1}.")
        self.init_layer, self.mlp = init_layer, mlp
        block = as_dense(copy.deepcopy(stack.inner.layers[init_layer]))  # a native target's layer as floats
        if not all(hasattr(block, part) for part in ("input_layernorm", "self_attn", "post_attention_layernorm",
                                                     "mlp")):
            raise ConfigError(f"{type(block).__name__} is not a pre-norm block (input_layernorm, self_attn, "
                              "post_attention_layernorm, mlp), which an EAGLE head or exit adapter is built from; "
                              "use another drafter for this family.")
        block.self_attn.layer_idx = 0  # its own one-layer cache
        if not mlp:
            del block.mlp, block.post_attention_layernorm
        self.block = block
        self.norm = copy.deepcopy(stack.inner.norm)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, hidden, rotary, cache=None, mask=None, **attention) -> torch.Tensor:
        """The block's output [B, q, H] for input states ``hidden`` (KV appended to ``cache``);
        ``attention`` goes to the attention function (the compiled runtime's draft paths)."""
        b = self.block
        attn, _ = b.self_attn(b.input_layernorm(hidden), position_embeddings=rotary, attention_mask=mask,
                              cache=cache, use_cache=cache is not None, **attention)
        hidden = hidden + attn
        if self.mlp:
            hidden = hidden + b.mlp(b.post_attention_layernorm(hidden))
        return hidden

    def logits(self, adapted: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return torch.nn.functional.linear(self.norm(adapted), self.head)

    def describe(self) -> dict:
        return {"init_layer": self.init_layer, "mlp": self.mlp, **super().describe()}


def save_head(head: VocabHead, out_dir, target_info: dict, record: dict, dtype=STORAGE_DTYPE,
              overwrite: bool = False, quantize: str | None = DEFAULT_QUANTIZE,
              quantize_head: str | None = None) -> Path:
    """Write the head's weights (`storage_tensors`: vectors in ``dtype``, matrices quantized as
    ``quantize`` says, a trained output layer as ``quantize_head`` when given; `load_head` restores
    them in the target's dtype) + JSON record with `write_artefact` (atomic; replaces only a previous
    artefact). An untrained head's rows are the target's: not stored, recorded by digest (``from_target``)."""
    quantize_head = quantize_head if head.train_head else None
    tensors = storage_tensors(head.state_dict(), dtype, quantize, {"head": quantize_head} if quantize_head else None)
    taken = {} if head.train_head else {"lm_head_rows": target_digests(head.head)}
    full = {"format": head.FORMAT, "format_version": head.FORMAT_VERSION,
            **storage_record(dtype, quantize, quantize_head),
            **head.describe(), "target": target_info, **({"from_target": taken} if taken else {}), **record}
    return write_artefact(out_dir, head.RECORD, full, lambda tmp: save_file(tensors, str(tmp / head.WEIGHTS)),
                          overwrite=overwrite)


def read_head_record(cls: type[VocabHead], path, key: str, fix: str) -> dict:
    path = Path(path).expanduser()
    file = path / cls.RECORD
    if not path.is_dir() or not file.is_file():
        raise ConfigError(f"{key}={str(path)!r} is not an {cls.WHAT} directory (no {cls.RECORD}); {fix}.")
    return read_record(file, cls.FORMAT, cls.FORMAT_VERSION, cls.WHAT, f"retrain or re-copy the {cls.WHAT}")


Head = TypeVar("Head", bound=VocabHead)


def load_head(cls: type[Head], path, target_model, key: str, train_command: str) -> Head:
    """The ``cls`` head at ``path``, checked against ``target_model``; frozen, on its device."""
    path = Path(path).expanduser()
    record = read_head_record(cls, path, key, f"train one with `{train_command}`, or set {key}=null")
    check_target(record, target_model, path, key=key, fix=f"`{train_command}`")
    try:
        tensors = load_file(str(path / cls.WEIGHTS))
    except Exception as e:  # missing, truncated or corrupt file
        raise ConfigError(f"{key}={str(path)!r}: {cls.WEIGHTS} cannot be read ({type(e).__name__}: "
                          f"{str(e)[:160]}); the file is corrupt or incomplete: retrain or re-copy it.") from None
    tensors = restored_tensors(tensors, key, path, cls.WHAT)
    check_artefact_values(record, tensors, key, path, cls.WHAT)
    ids, vocab = tensors.get("vocab_ids"), target_model.lm_head.weight.shape[0]
    if ids is not None and (ids.dim() != 1 or ids.is_floating_point() or not ids.numel()
                            or int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ConfigError(f"{key}: {cls.WEIGHTS} in {path} has vocab_ids outside the target's vocabulary "
                          f"(0..{vocab - 1}); the {cls.WHAT} was made for another model or is corrupt: retrain "
                          "or re-copy it.")
    try:
        head = cls.from_record(target_model, record, ids)
    except KeyError as e:
        raise ConfigError(f"{key}: {path / cls.RECORD} lacks {e}; "
                          f"the {cls.WHAT} is corrupt: retrain or re-copy it.") from None
    dtype = target_model.lm_head.weight.dtype
    try:
        head.load_state_dict({k: (v if k == "vocab_ids" else v.to(dtype)) for k, v in tensors.items()})
    except RuntimeError as e:
        raise ConfigError(f"{key}={str(path)!r}: the weights do not fit {cls.RECORD} or this target "
                          f"({str(e)[:160]}); retrain or re-copy the {cls.WHAT}.") from None
    if not head.train_head:  # its rows are the target's, taken now: the ones it was trained with?
        check_from_target(record, {"lm_head_rows": head.head}, key, path, cls.WHAT, f"`{train_command}`")
    head.record = record
    return head.to(target_model.device).eval().requires_grad_(False)
