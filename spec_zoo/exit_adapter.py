"""The exit adapter: a small trained module between layer E and the LM head (Kangaroo).

The untrained early exit (the target's final norm + LM head on layer E's hidden state)
rarely agrees with the target on a thin model, because layer E's states are not yet
in the form the head reads. The adapter closes part of that gap *next to* the target:

* ``block``: one decoder layer of the target's own class, initialised from one of its
  layers (attention + MLP, or attention only as in Kangaroo); it runs as an extra layer
  with its own KV cache, so it sees the whole context, not just the current token;
* ``norm``: a copy of the target's final norm;
* a head over a reduced *draft vocabulary* (the most frequent tokens of the training
  data): logits exist only there, so q is exactly zero elsewhere and exact verification
  stays exact. The head rows are the target's (frozen, not stored) unless trained.

It never touches the target's weights or caches, so a lossless verifier stays lossless.

Artefact: a directory with ``adapter.safetensors`` (block, norm, draft vocabulary, and the
head when trained) and ``adapter.json`` (exit layer, shapes, the target it was trained
for with an embedding fingerprint, training record). Loading refuses another target,
another exit layer, or files that do not fit together.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import read_record, write_artefact
from spec_zoo.errors import ConfigError
from spec_zoo.layers import DecoderStack

FORMAT = "spec-zoo-exit-adapter"
FORMAT_VERSION = 1
WEIGHTS, RECORD = "adapter.safetensors", "adapter.json"


class ExitAdapter(torch.nn.Module):
    """Layer-E hidden states -> logits over the draft vocabulary (see the module docstring).

    init_layer: the target layer the block starts as a copy of.
    vocab_ids:  LongTensor [K] of target token ids (row order of the head), or None (all).
    """

    def __init__(self, target_model, exit_layer: int, init_layer: int, mlp: bool = True,
                 vocab_ids: torch.Tensor | None = None, train_head: bool = False):
        super().__init__()
        stack = DecoderStack(target_model)
        check_exit_layer(exit_layer, stack.num_layers)
        if not 0 <= init_layer < stack.num_layers:
            raise ConfigError(f"adapter.init_layer={init_layer}; the target has layers 0..{stack.num_layers - 1}.")
        self.exit_layer, self.init_layer, self.mlp, self.train_head = exit_layer, init_layer, mlp, train_head
        block = copy.deepcopy(stack.inner.layers[init_layer])
        block.self_attn.layer_idx = 0  # its own one-layer cache
        if not mlp:
            del block.mlp, block.post_attention_layernorm
        self.block = block
        self.norm = copy.deepcopy(stack.inner.norm)
        weight = target_model.lm_head.weight.detach()
        if vocab_ids is not None:
            vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long)
            weight = weight[vocab_ids.to(weight.device)]
        self.register_buffer("vocab_ids", vocab_ids)
        if train_head:
            self.head = torch.nn.Parameter(weight.clone())
        else:  # the target's rows, rebuilt at load: not stored
            self.register_buffer("head", weight.clone(), persistent=False)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, hidden, rotary, cache=None, mask=None) -> torch.Tensor:
        """Adapted states [B, q, H] of layer-E states ``hidden`` (KV appended to ``cache``)."""
        b = self.block
        attn, _ = b.self_attn(b.input_layernorm(hidden), position_embeddings=rotary, attention_mask=mask,
                              cache=cache, use_cache=cache is not None)
        hidden = hidden + attn
        if self.mlp:
            hidden = hidden + b.mlp(b.post_attention_layernorm(hidden))
        return hidden

    def logits(self, adapted: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return torch.nn.functional.linear(self.norm(adapted), self.head)

    def describe(self) -> dict:
        return {"exit_layer": self.exit_layer, "init_layer": self.init_layer, "mlp": self.mlp,
                "train_head": self.train_head, "hidden_size": int(self.head.shape[1]),
                "draft_vocab_size": int(self.head.shape[0])}


def check_exit_layer(exit_layer: int, num_layers: int, key: str = "drafter.exit_layer") -> None:
    if not 1 <= int(exit_layer) <= num_layers - 1:
        raise ConfigError(f"{key}={exit_layer}; the target has {num_layers} layers, so the exit must be in "
                          f"1..{num_layers - 1} (the draft runs layers 0..E-1, the target resumes at E).")


def save_adapter(adapter: ExitAdapter, out_dir, target_info: dict, record: dict, dtype=torch.float16) -> Path:
    """Write ``adapter.safetensors`` + ``adapter.json`` atomically (temp dir, then rename)."""
    tensors = {k: (v if k == "vocab_ids" else v.to(dtype)).detach().contiguous()
               for k, v in adapter.state_dict().items()}
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **adapter.describe(), "target": target_info, **record}
    return write_artefact(out_dir, RECORD, full, lambda tmp: save_file(tensors, str(tmp / WEIGHTS)))


def read_adapter_record(path) -> dict:
    path = Path(path).expanduser()
    file = path / RECORD
    if not path.is_dir() or not file.is_file():
        raise ConfigError(f"drafter.adapter={str(path)!r} is not an exit-adapter directory (no {RECORD}); "
                          "train one with `spec-zoo-train early_exit`, or set drafter.adapter=null.")
    return read_record(file, FORMAT, FORMAT_VERSION, "exit-adapter", "retrain or re-copy the adapter")


def load_adapter(path, target_model, exit_layer: int | None = None) -> ExitAdapter:
    """The adapter at ``path``, checked against ``target_model`` (and ``exit_layer`` when given)."""
    from spec_zoo.train.student import check_target

    path = Path(path).expanduser()
    record = read_adapter_record(path)
    check_target(record, target_model, path, key="drafter.adapter", fix="`spec-zoo-train early_exit`")
    if exit_layer is not None and int(record["exit_layer"]) != int(exit_layer):
        raise ConfigError(f"drafter.adapter={str(path)!r} was trained for exit layer {record['exit_layer']}, "
                          f"not drafter.exit_layer={exit_layer}; set drafter.exit_layer={record['exit_layer']} "
                          "or train an adapter for this exit layer.")
    try:
        tensors = load_file(str(path / WEIGHTS))
    except Exception as e:  # missing, truncated or corrupt file
        raise ConfigError(f"drafter.adapter={str(path)!r}: {WEIGHTS} cannot be read ({type(e).__name__}: "
                          f"{str(e)[:160]}); the file is corrupt or incomplete: retrain or re-copy it.") from None
    adapter = ExitAdapter(target_model, int(record["exit_layer"]), int(record["init_layer"]), bool(record["mlp"]),
                          tensors.get("vocab_ids"), bool(record["train_head"]))
    dtype = target_model.lm_head.weight.dtype
    try:
        adapter.load_state_dict({k: (v if k == "vocab_ids" else v.to(dtype)) for k, v in tensors.items()})
    except RuntimeError as e:
        raise ConfigError(f"drafter.adapter={str(path)!r}: the weights do not fit {RECORD} or this target "
                          f"({str(e)[:160]}); retrain or re-copy the adapter.") from None
    return adapter.to(target_model.device).eval().requires_grad_(False)
