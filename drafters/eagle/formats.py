"""Published EAGLE heads: read (and write) the layouts other projects train and serve.

Three layouts are read, each into a head `spec_zoo.drafters.eagle.drafter.EagleDrafter`
drafts with, forward as in the reference code:

* ``eagle`` (EAGLE-1/2, SafeAILab/EAGLE ``cnets1.py``): a one-layer Llama ``config.json``;
  ``fc.weight`` [2H→H] (and ``fc.bias``) over ``[embed(x_{i+1}), f_i]``, ``layers.0.*`` (a
  decoder layer without its input norm), the target's own LM head on the layer's output. f
  is the target's last-layer state (after its final norm), then the head's own output.
* ``eagle3`` (EAGLE-3, ``cnets.py``): a one-layer Llama ``config.json`` with
  ``draft_vocab_size``; ``fc.weight`` [3H→H] fuses the target's states entering three layers
  (low, middle, high: ``eagle_aux_hidden_state_layer_ids``, default ``(2, L // 2, L - 3)``);
  ``midlayer.*``: the layer normalises the embedding (``input_layernorm``) and the feature
  (``hidden_norm``) apart, attends over both side by side (q/k/v read 2H), adds the feature
  back; ``norm`` + ``lm_head`` over the draft vocabulary; ``d2t`` (draft id + d2t = target
  id) and ``t2d`` (the target ids in the draft vocabulary). Later positions read the layer's
  own output, without ``fc``.
* ``speculators`` (vLLM's layout for the same EAGLE-3 head): ``config.json`` with
  ``speculators_model_type: eagle3``, ``transformer_layer_config``, ``draft_vocab_size``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, ``norm_before_residual``;
  ``model.safetensors`` with ``layers.0.*`` in place of ``midlayer.*``.

Both EAGLE-3 layouts can be written back (`save_eagle3`), so a head converts between them.
Weights are read from safetensors only (``pytorch_model.bin`` would need unpickling); a
key that does not belong, or one missing, is an error, never skipped. The embeddings are
always the target's (as in the reference code), so a stored ``embed_tokens.weight`` is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from spec_zoo.artefacts import write_artefact
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.layers import DecoderStack

#: the ``format=`` values of `EagleDrafter` (``spec_zoo``: its own artefact, `spec_zoo.drafters.eagle.head`)
FORMATS = ("auto", "spec_zoo", "eagle", "eagle3", "speculators")
WEIGHTS = "model.safetensors"
#: where each layout keeps the decoder layer's weights (ours: ``layer.``)
LAYER_PREFIX = {"eagle": "layers.0.", "eagle3": "midlayer.", "speculators": "layers.0."}
SPECULATORS_VERSION = "0.1.0"


class PublishedHead(torch.nn.Module):
    """What the published EAGLE heads share: their own RoPE (from their config), a one-layer
    cache (layer 0), and the reference's alignment: head position j pairs token j + 1 with
    the target's state at j, so the first token is never fed."""

    starts_at_second_token = True
    #: layer ids whose entering states the head reads, or None for the target's last-layer state
    target_layers: tuple[int, ...] | None = None

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return self.rotary_emb(hidden, position_ids=positions)

    def feature(self, out: torch.Tensor) -> torch.Tensor:
        """The next position reads the layer's output as it is (no norm), as in the reference."""
        return out


class EagleOneHead(PublishedHead):
    """EAGLE-1/2: ``layer(fc([embed, feature]))``; logits = the target's LM head on the output."""

    head: torch.Tensor  # a buffer: the target's LM-head weight

    def __init__(self, config: LlamaConfig, target_model, bias: bool):
        super().__init__(config)
        H = config.hidden_size
        self.fc = torch.nn.Linear(2 * H, H, bias=bias)
        self.layer.add_module("input_layernorm", torch.nn.Identity())  # EAGLE-1's layer 0 has none
        self.register_buffer("head", target_model.lm_head.weight.detach(), persistent=False)
        self.vocab_ids = None

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([embeds, features], dim=-1))

    def forward(self, hidden, rotary, cache=None, mask=None, **attention) -> torch.Tensor:
        return self.layer(hidden, attention_mask=mask, cache=cache, use_cache=cache is not None,
                          position_embeddings=rotary, **attention)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(out, self.head)


class Eagle3Head(PublishedHead):
    """EAGLE-3 (see the module docstring). ``inputs`` returns ``[embed, feature]`` side by side
    ([.., 2H]); the feature is ``fc`` of the target's fused states, or the head's own output."""

    target_layers: tuple[int, ...]
    d2t: torch.Tensor  # buffers: draft id -> target id offset, and which target ids the draft vocabulary holds
    t2d: torch.Tensor

    def __init__(self, config: LlamaConfig, target_layers: tuple[int, ...], target_hidden: int,
                 draft_vocab: int, target_vocab: int, norm_before_residual: bool = False):
        super().__init__(config)
        H, heads, kv, dim = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                             config.head_dim)
        assert kv is not None and dim is not None  # LlamaConfig fills both in
        attn = self.layer.self_attn
        attn.q_proj = torch.nn.Linear(2 * H, heads * dim, bias=config.attention_bias)
        attn.k_proj = torch.nn.Linear(2 * H, kv * dim, bias=config.attention_bias)
        attn.v_proj = torch.nn.Linear(2 * H, kv * dim, bias=config.attention_bias)
        self.layer.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.target_layers, self.norm_before_residual = tuple(target_layers), norm_before_residual
        self.fc = torch.nn.Linear(len(self.target_layers) * target_hidden, H, bias=False)
        self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(H, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab, dtype=torch.bool))

    @classmethod
    def from_target(cls, target_model, target_layers: tuple[int, ...], init_layer: int,
                    vocab_ids: torch.Tensor | None = None) -> Eagle3Head:
        """A head to train for ``target_model`` (`spec-zoo-train eagle3`), starting as the
        target's layer ``init_layer`` continuing its state: ``fc`` passes the last fused layer's
        state through, the layer's feature half of q/k/v, its o_proj, MLP and norms are the
        target layer's (the embedding half starts at zero, so the drafted token enters as
        training finds it useful), ``norm`` and ``lm_head`` the target's (rows ``vocab_ids``,
        sorted: EAGLE-3's ``t2d`` mask orders the draft vocabulary by target id)."""
        stack = DecoderStack(target_model)
        src = stack.inner.layers[init_layer]
        attn = getattr(src, "self_attn", src)
        if not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")) or not all(
                hasattr(src, p) for p in ("input_layernorm", "post_attention_layernorm", "mlp")):
            raise ConfigError(f"{type(src).__name__} is not a Llama-shaped block (input_layernorm, self_attn with "
                              "q/k/v/o_proj, post_attention_layernorm, mlp), which an EAGLE-3 head is built from; "
                              "use drafter=eagle (spec-zoo-train eagle) for this family.")
        fields = {k: v for k, v in target_model.config.to_dict().items() if k not in ("layer_types",)}
        config = _llama_config({**fields, "num_hidden_layers": 1}, "head", target_model)
        V = int(target_model.lm_head.weight.shape[0])
        ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long).sort().values
        head = cls(config, target_layers, config.hidden_size, V if ids is None else ids.numel(), V)
        H, weight = config.hidden_size, target_model.lm_head.weight.detach()
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj"):
                mine, theirs = getattr(head.layer.self_attn, name), getattr(attn, name)
                mine.weight.copy_(torch.cat([torch.zeros_like(theirs.weight), theirs.weight], 1))
                if mine.bias is not None:
                    mine.bias.copy_(theirs.bias)
            for part in ("post_attention_layernorm", "mlp"):
                getattr(head.layer, part).load_state_dict(getattr(src, part).state_dict())
            head.layer.self_attn.o_proj.load_state_dict(attn.o_proj.state_dict())
            for norm in (head.layer.input_layernorm, head.layer.hidden_norm):
                norm.weight.copy_(src.input_layernorm.weight)
            head.norm.weight.copy_(stack.inner.norm.weight)
            head.fc.weight.zero_()
            head.fc.weight[:, -H:].copy_(torch.eye(H))
            head.lm_head.weight.copy_(weight if ids is None else weight[ids.to(weight.device)])
            if ids is None:
                head.t2d.fill_(True)
            else:
                head.d2t.copy_(ids - torch.arange(ids.numel()))
                head.t2d[ids] = True
        return head.to(device=weight.device, dtype=weight.dtype)

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """Target ids of the draft vocabulary's rows (None: the draft vocabulary is the target's)."""
        if self.lm_head.out_features == self.t2d.numel() and not self.d2t.any():
            return None
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] == self.fc.in_features:  # the target's fused states (else the head's own)
            features = self.fc(features)
        return torch.cat([embeds, features], dim=-1)

    def forward(self, hidden, rotary, cache=None, mask=None, **attention) -> torch.Tensor:
        layer = self.layer
        embeds, feature = hidden.split(self.config.hidden_size, dim=-1)
        normed = cast(LlamaRMSNorm, layer.hidden_norm)(feature)
        residual = normed if self.norm_before_residual else feature
        attn, _ = layer.self_attn(torch.cat([layer.input_layernorm(embeds), normed], dim=-1),
                                  position_embeddings=rotary, attention_mask=mask, cache=cache,
                                  use_cache=cache is not None, **attention)
        hidden = residual + attn
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))


# -- reading --------------------------------------------------------------------------------------


def _config(path: Path, key: str) -> dict:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{key}={str(path)!r} has no config.json; a published EAGLE head is a directory with "
                          f"config.json and {WEIGHTS}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: {file} is not valid JSON ({e}); re-download the head.") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{key}: {file} is not a JSON object; re-download the head.")
    return config


def _tensors(path: Path, key: str, names_only: bool = False) -> dict[str, torch.Tensor | None]:
    file = path / WEIGHTS
    if not file.is_file():
        found = sorted(p.name for p in path.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".safetensors"))
        hint = (f" ({', '.join(found)} found: spec-zoo reads safetensors only, never pickles; convert it with "
                "safetensors.torch.save_file)") if found else ""
        raise ConfigError(f"{key}={str(path)!r} has no {WEIGHTS}{hint}.")
    try:
        with safe_open(str(file), framework="pt") as f:
            return {k: None if names_only else f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle is not iterable)
    except Exception as e:  # truncated or corrupt
        raise ConfigError(f"{key}: {file} cannot be read ({type(e).__name__}: {str(e)[:120]}); "
                          "re-download it.") from None


def sniff(path, key: str = "drafter.head") -> str:
    """The layout of the head at ``path``: spec_zoo, speculators, eagle3, eagle or medusa."""
    path = Path(path).expanduser()
    if (path / "eagle.json").is_file() or (path / "medusa.json").is_file():
        return "spec_zoo"
    if (path / "medusa_lm_head.safetensors").is_file() or (path / "medusa_lm_head.pt").is_file():
        return "medusa"
    if not path.is_dir():
        raise ConfigError(f"{key}={str(path)!r} is not a directory; give a head directory (spec-zoo's, EAGLE's, "
                          "speculators' or Medusa's).")
    config = _config(path, key)
    if "speculators_model_type" in config:
        return "speculators"
    if "medusa_num_heads" in config:
        return "medusa"
    names = set(_tensors(path, key, names_only=True)) if (path / WEIGHTS).is_file() else set()
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names or "draft_vocab_size" in config:
        return "eagle3"
    return "eagle"


def _llama_config(layer: dict, key: str, target_model) -> LlamaConfig:
    if layer.get("num_hidden_layers", 1) != 1:
        raise ConfigError(f"{key}: the head has num_hidden_layers={layer['num_hidden_layers']}; published EAGLE "
                          "heads have one decoder layer, and spec-zoo reads only those.")
    fields = {k: v for k, v in layer.items() if k not in ("architectures", "auto_map", "model_type", "torch_dtype",
                                                           "dtype", "transformers_version")}
    config = LlamaConfig(**fields)
    config._attn_implementation = target_model.config._attn_implementation
    want, have = config.hidden_size, int(target_model.config.hidden_size)
    if want != have:
        raise ConfigError(f"{key}: the head has hidden_size {want} but the target has {have}; use a head trained "
                          "for this target.")
    return config


def default_layers(num_layers: int) -> tuple[int, ...]:
    """The layers an EAGLE-3 head reads by default (the reference's): low, middle, high."""
    return (2, num_layers // 2, num_layers - 3)


def _target_layers(config: dict, layers: int, key: str, num_layers: int) -> tuple[int, ...]:
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = default_layers(num_layers)
    ids = [int(i) for i in ids]
    if len(ids) != layers or not all(0 <= i < num_layers for i in ids):
        raise ConfigError(f"{key}: the head reads the target's layers {ids} (eagle_aux_hidden_state_layer_ids) but "
                          f"its fc fuses {layers} and the target has layers 0..{num_layers - 1}; use a head trained "
                          "for this target, or set eagle_aux_hidden_state_layer_ids in its config.json.")
    return tuple(ids)


def _load_weights(head: torch.nn.Module, tensors: dict, prefix: str, key: str, path: Path) -> None:
    renamed = {("layer." + k[len(prefix):]) if k.startswith(prefix) else k: v for k, v in tensors.items()
               if k != "embed_tokens.weight"}
    missing, unexpected = head.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        def name(k):
            return prefix + k[len("layer."):] if k.startswith("layer.") else k
        parts = ([f"missing {', '.join(name(k) for k in missing[:4])}"] if missing else []) + (
            [f"unexpected {', '.join(name(k) for k in unexpected[:4])}"] if unexpected else [])
        raise ConfigError(f"{key}={str(path)!r}: the weights do not match the layout ({'; '.join(parts)}); is "
                          "drafter.format right?")


def load_published(path, target_model, fmt: str, key: str = "drafter.head") -> PublishedHead:
    """The ``fmt`` head at ``path`` (``auto``: sniffed), checked against ``target_model``."""
    path = Path(path).expanduser()
    fmt = sniff(path, key) if fmt == "auto" else fmt
    if fmt not in LAYER_PREFIX:
        raise ConfigError(f"{key}={str(path)!r} is a {fmt} head, not an EAGLE head; use drafter={fmt} "
                          f"drafter.heads=PATH, or drafter.format= one of {', '.join(FORMATS)}.")
    config, tensors = _config(path, key), cast(dict[str, torch.Tensor], _tensors(path, key))  # not names_only
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ConfigError(f"{key}={str(path)!r}: {bad[0]} holds NaN or infinite values; re-download the head.")
    target_vocab = int(target_model.lm_head.weight.shape[0])
    num_layers = int(target_model.config.num_hidden_layers)
    head: PublishedHead
    if fmt == "eagle":
        head = EagleOneHead(_llama_config(config, key, target_model), target_model, "fc.bias" in tensors)
    else:
        if fmt == "speculators":
            if config.get("speculators_model_type") != "eagle3":
                raise ConfigError(f"{key}: speculators_model_type={config.get('speculators_model_type')!r}; spec-zoo "
                                  "reads speculators' eagle3 heads.")
            layer = config.get("transformer_layer_config")
            if not isinstance(layer, dict):
                raise ConfigError(f"{key}: config.json has no transformer_layer_config; re-download the head.")
        else:
            layer = config
        llama = _llama_config(layer, key, target_model)
        vocab = int(layer.get("vocab_size", target_vocab))
        if vocab != target_vocab:
            raise ConfigError(f"{key}: the head is for a vocabulary of {vocab} tokens but the target has "
                              f"{target_vocab}; use a head trained for this target.")
        fc = tensors.get("fc.weight")
        target_hidden = int(config.get("target_hidden_size") or llama.hidden_size)
        if target_hidden != llama.hidden_size:
            raise ConfigError(f"{key}: target_hidden_size {target_hidden} but the target has {llama.hidden_size}; "
                              "use a head trained for this target.")
        fused = fc.shape[1] // target_hidden if fc is not None and fc.dim() == 2 else 3
        head = Eagle3Head(llama, _target_layers(config, fused, key, num_layers), target_hidden,
                          int(config.get("draft_vocab_size") or target_vocab), target_vocab,
                          bool(config.get("norm_before_residual", False)))
    try:
        _load_weights(head, tensors, LAYER_PREFIX[fmt], key, path)
    except RuntimeError as e:  # a shape that does not fit the config
        raise ConfigError(f"{key}={str(path)!r}: the weights do not fit its config.json "
                          f"({str(e).splitlines()[-1][:160]}); re-download the head.") from None
    if isinstance(head, Eagle3Head):
        _check_vocab_map(head, target_vocab, key, path)
    return head.to(device=target_model.device, dtype=target_model.lm_head.weight.dtype).eval().requires_grad_(False)


def _check_vocab_map(head: Eagle3Head, target_vocab: int, key: str, path: Path) -> None:
    ids = head.vocab_ids
    if ids is None:
        return
    if int(ids.min()) < 0 or int(ids.max()) >= target_vocab or ids.unique().numel() != ids.numel():
        raise ConfigError(f"{key}={str(path)!r}: d2t maps draft tokens outside the target's vocabulary "
                          f"(0..{target_vocab - 1}) or twice onto one; re-download the head.")
    if head.t2d.any() and (int(head.t2d.sum()) != ids.numel() or not bool(head.t2d[ids].all())):
        raise ConfigError(f"{key}={str(path)!r}: t2d and d2t disagree on the draft vocabulary; re-download the head.")


# -- writing --------------------------------------------------------------------------------------


def save_eagle3(head: Eagle3Head, out_dir, layout: str, verifier: str | None = None,
                dtype: torch.dtype = torch.float16) -> Path:
    """Write an EAGLE-3 head in ``layout`` (``eagle3``: the original keys and a Llama config;
    ``speculators``: vLLM's config and keys), atomically, into a new or empty directory."""
    config, write = eagle3_files(head, layout, verifier, dtype)
    return write_artefact(out_dir, "config.json", config, write, key="export.out", fmt=f"{layout} layout")


def eagle3_files(head: Eagle3Head, layout: str, verifier: str | None = None,
                 dtype: torch.dtype = torch.float16) -> tuple[dict, Callable[[Path], None]]:
    """The ``config.json`` of ``head`` in ``layout``, and what writes its weights into a directory."""
    prefix = LAYER_PREFIX[layout]
    tensors = {(prefix + k[len("layer."):]) if k.startswith("layer.") else k:
               (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
               for k, v in head.state_dict().items()}
    layer = {k: v for k, v in head.config.to_diff_dict().items() if k not in ("_attn_implementation_autoset",)}
    layer.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1,
                 vocab_size=int(head.t2d.numel()))
    common = {"draft_vocab_size": int(head.lm_head.out_features), "target_hidden_size": int(head.fc.in_features) //
              len(head.target_layers), "eagle_aux_hidden_state_layer_ids": list(head.target_layers),
              "norm_before_residual": head.norm_before_residual}
    if layout == "eagle3":
        config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], **common}
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
            },
            "transformer_layer_config": layer,
            **common,
        }
    return config, lambda tmp: save_file(tensors, str(tmp / WEIGHTS))
