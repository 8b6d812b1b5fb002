"""Published draft layouts (docs/formats.md): EAGLE-1/2, EAGLE-3 (original and speculators),
Medusa. Each test writes a small checkpoint from the layout's documented keys and the
reference code's shapes on a tiny target, and checks the imported draft against a reference
forward written here from the reference algorithm (SafeAILab/EAGLE ``cnets1.py``/``cnets.py``,
FasterDecoding/Medusa ``medusa_model.py``), recomputed from scratch at every step."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.draft_head import load_head, save_head
from spec_zoo.drafters.eagle import EagleDrafter
from spec_zoo.drafters.eagle.formats import load_published, save_eagle3
from spec_zoo.drafters.medusa import MedusaDrafter
from spec_zoo.drafters.medusa.formats import load_published_medusa, save_medusa
from spec_zoo.drafters.medusa.heads import MedusaHeads
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from spec_zoo.testing import P_MIN, SETTINGS, assert_greedy_identity, repetitive_prompt, sampling_model, sampling_pvalue
from spec_zoo.verifiers.greedy import GreedyVerifier
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)

# -- writing checkpoints in each layout ------------------------------------------------------------


def _shapes(model):
    c = model.config
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.hidden_size, c.num_attention_heads * dim, c.num_key_value_heads * dim, c.intermediate_size


def _layer_config(model, **extra) -> dict:
    c = model.config
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "rope_theta": 5000.0, "max_position_embeddings": 256, "vocab_size": c.vocab_size, "hidden_act": "silu",
            **extra}


def _rand(gen, *shape, scale=0.3, around=0.0):
    return (around + scale * torch.randn(*shape, generator=gen)).float()


def eagle3_tensors(model, draft_ids: torch.Tensor | None, prefix: str, seed: int = 0, fused: int = 3) -> dict:
    gen = torch.Generator().manual_seed(seed)
    H, q, kv, inter = _shapes(model)
    V = model.config.vocab_size
    vd = V if draft_ids is None else len(draft_ids)
    t = {prefix + "self_attn.q_proj.weight": _rand(gen, q, 2 * H),
         prefix + "self_attn.k_proj.weight": _rand(gen, kv, 2 * H),
         prefix + "self_attn.v_proj.weight": _rand(gen, kv, 2 * H),
         prefix + "self_attn.o_proj.weight": _rand(gen, H, q),
         prefix + "mlp.gate_proj.weight": _rand(gen, inter, H), prefix + "mlp.up_proj.weight": _rand(gen, inter, H),
         prefix + "mlp.down_proj.weight": _rand(gen, H, inter),
         prefix + "input_layernorm.weight": _rand(gen, H, around=1),
         prefix + "hidden_norm.weight": _rand(gen, H, around=1),
         prefix + "post_attention_layernorm.weight": _rand(gen, H, around=1),
         "fc.weight": _rand(gen, H, fused * H, scale=0.2), "norm.weight": _rand(gen, H, around=1),
         "lm_head.weight": _rand(gen, vd, H, scale=1.0), "embed_tokens.weight": _rand(gen, V, H)}
    ids = torch.arange(V) if draft_ids is None else draft_ids
    t["d2t"] = ids - torch.arange(vd)
    t["t2d"] = torch.zeros(V, dtype=torch.bool)
    t["t2d"][ids] = True
    return t


def write_eagle3(path, model, layout: str, draft_ids=None, layers=(0, 1, 1), seed=0, **edit):
    """An EAGLE-3 head in ``layout`` (eagle3: SafeAILab's keys; speculators: vLLM's)."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = eagle3_tensors(model, draft_ids, "midlayer." if layout == "eagle3" else "layers.0.", seed)
    vd = len(tensors["d2t"])
    if layout == "eagle3":
        config = _layer_config(model, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vd,
                               eagle_config={"eagle_aux_hidden_state_layer_ids": list(layers)})
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "speculators_version": "0.1.0",
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                         "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
                  "transformer_layer_config": _layer_config(model), "draft_vocab_size": vd,
                  "target_hidden_size": model.config.hidden_size, "eagle_aux_hidden_state_layer_ids": list(layers),
                  "norm_before_residual": False}
    config.update(edit.pop("config", {}))
    tensors.update(edit.pop("tensors", {}))
    for name in edit.pop("drop", ()):
        del tensors[name]
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def write_eagle1(path, model, seed=0):
    """An EAGLE-1/2 head (SafeAILab's cnets1 layout: fc with bias, layer 0 without input norm)."""
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    H, q, kv, inter = _shapes(model)
    tensors = {"fc.weight": _rand(gen, H, 2 * H, scale=0.2), "fc.bias": _rand(gen, H, scale=0.1),
               "layers.0.self_attn.q_proj.weight": _rand(gen, q, H),
               "layers.0.self_attn.k_proj.weight": _rand(gen, kv, H),
               "layers.0.self_attn.v_proj.weight": _rand(gen, kv, H),
               "layers.0.self_attn.o_proj.weight": _rand(gen, H, q),
               "layers.0.mlp.gate_proj.weight": _rand(gen, inter, H),
               "layers.0.mlp.up_proj.weight": _rand(gen, inter, H),
               "layers.0.mlp.down_proj.weight": _rand(gen, H, inter),
               "layers.0.post_attention_layernorm.weight": _rand(gen, H, around=1)}
    (path / "config.json").write_text(json.dumps(_layer_config(model)))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def write_medusa(path, model, heads=3, layers=1, seed=0):
    """Medusa heads in FasterDecoding's layout: head i = Sequential(ResBlock x layers, Linear(H, V))."""
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    H, V = model.config.hidden_size, model.config.vocab_size
    tensors = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"{i}.{j}.linear.weight"] = _rand(gen, H, H)
            tensors[f"{i}.{j}.linear.bias"] = _rand(gen, H, scale=0.1)
        tensors[f"{i}.{layers}.weight"] = _rand(gen, V, H, scale=1.0)
    (path / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                  "base_model_name_or_path": "tiny"}))
    save_file(tensors, str(path / "medusa_lm_head.safetensors"))
    return path


# -- reference forwards (the reference algorithms, no cache, from scratch) ------------------------


def _rms(x, w, eps=1e-6):
    """RMSNorm computed in float32, as the reference code's LlamaRMSNorm does."""
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, positions, theta=5000.0):
    """Rotary embedding with float32 tables, as the reference code builds them (then cast up)."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    freqs = positions.float()[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], -1)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * emb.cos().to(x.dtype) + rotated * emb.sin().to(x.dtype)


def _attention(x, w, p, model):
    """Causal multi-head attention (GQA), positions 0..n-1, as LlamaAttention (eager)."""
    c = model.config
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    dim = w[p + "self_attn.q_proj.weight"].shape[0] // heads
    n = x.shape[0]
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, dim).transpose(0, 1)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(n, kv, dim).transpose(0, 1)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, kv, dim).transpose(0, 1)
    pos = torch.arange(n)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * dim)
    return out @ w[p + "self_attn.o_proj.weight"].T


def _mlp(x, w, p):
    gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
    return (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T


def _target_states(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens]), output_hidden_states=True).hidden_states


def reference_eagle3(model, w, layers, tokens, k, prefix="midlayer."):
    """EAGLE-3's greedy chain of ``k`` target ids after ``tokens`` and the logits over the
    target's vocabulary each was picked from (-inf outside the draft vocabulary; cnets.py,
    recomputed)."""
    w = {name: t.double() if t.is_floating_point() else t for name, t in w.items()}
    states = _target_states(model, tokens[:-1])
    features = list(torch.cat([states[i][0] for i in layers], -1) @ w["fc.weight"].T)  # fc of the fused states
    seq, embed, out, rows = list(tokens[1:]), model.model.embed_tokens.weight.detach(), [], []
    ids = torch.arange(len(w["d2t"])) + w["d2t"]
    for _ in range(k):
        feats = torch.stack(features)
        e = _rms(embed[torch.tensor(seq)], w[prefix + "input_layernorm.weight"])
        h = _rms(feats, w[prefix + "hidden_norm.weight"])
        hidden = feats + _attention(torch.cat([e, h], -1), w, prefix, model)
        hidden = hidden + _mlp(_rms(hidden, w[prefix + "post_attention_layernorm.weight"]), w, prefix)
        logits = _rms(hidden[-1], w["norm.weight"]) @ w["lm_head.weight"].T
        d = int(logits.argmax())
        token = d + int(w["d2t"][d])
        row = torch.full((model.config.vocab_size,), float("-inf"), dtype=logits.dtype)
        rows.append(row.index_copy(0, ids, logits))
        out.append(token)
        seq.append(token)
        features.append(hidden[-1])  # the next position reads the layer's own output
    return out, rows


def reference_eagle1(model, w, tokens, k):
    """EAGLE-1/2's greedy chain (cnets1.py): fc([embed, f]) with bias, no input norm, target LM head."""
    w = {name: t.double() for name, t in w.items()}
    p = "layers.0."
    states = _target_states(model, tokens[:-1])
    features = list(states[-1][0])
    seq, embed, out, rows = list(tokens[1:]), model.model.embed_tokens.weight.detach(), [], []
    for _ in range(k):
        x = torch.cat([embed[torch.tensor(seq)], torch.stack(features)], -1) @ w["fc.weight"].T + w["fc.bias"]
        hidden = x + _attention(x, w, p, model)
        hidden = hidden + _mlp(_rms(hidden, w[p + "post_attention_layernorm.weight"]), w, p)
        rows.append(hidden[-1] @ model.lm_head.weight.detach().T)
        token = int(rows[-1].argmax())
        out.append(token)
        seq.append(token)
        features.append(hidden[-1])
    return out, rows


def reference_medusa(model, w, heads, layers, tokens):
    """Medusa's chain: head i's argmax on the target's last (normed) state (medusa_model.py)."""
    w = {name: t.double() for name, t in w.items()}
    h = _target_states(model, tokens[:-1] if len(tokens) > 1 else tokens)[-1][0, -1]
    out = []
    for i in range(heads):
        x = h
        for j in range(layers):
            x = x + torch.nn.functional.silu(x @ w[f"{i}.{j}.linear.weight"].T + w[f"{i}.{j}.linear.bias"])
        out.append(int((x @ w[f"{i}.{layers}.weight"].T).argmax()))
    return out


def recorded_drafts(model, drafter, prompt, max_new_tokens=16, logits=None):
    """(committed tokens, draft tokens) of every step of a greedy run; with a list ``logits``,
    an EAGLE drafter's logits rows of each drafting step are appended to it."""
    steps, propose = [], drafter.propose

    def spy(state):
        if logits is not None:
            logits.append([])
        draft = propose(state)
        steps.append((list(state.tokens), draft.tokens.tolist()))
        return draft

    if logits is not None:
        to_logits = drafter._logits

        def record(rows):  # each row of logits the head computed, in drafting order
            full = to_logits(rows)
            logits[-1].extend(full)
            return full

        drafter._logits = record
    drafter.propose = spy
    SpeculativeDecoder(Target(model), drafter, GreedyVerifier(), SamplingParams()).generate(
        prompt, max_new_tokens=max_new_tokens, eos_token_ids=[])
    if logits is not None:
        logits[:] = [rows for rows, (_, draft) in zip(logits, steps) if draft]
    return [(tokens, draft) for tokens, draft in steps if draft]


def assert_same_logits(ours, reference):
    """Equal up to float64 rounding, with -inf (outside the draft vocabulary) in the same places."""
    assert torch.equal(ours.isinf(), reference.isinf())
    torch.testing.assert_close(ours[ours.isfinite()], reference[reference.isfinite()], rtol=1e-9, atol=1e-9)


def _weights(path, name="model.safetensors"):
    from safetensors.torch import load_file

    return load_file(str(path / name))


# -- the imported drafts are the reference's --------------------------------------------------------


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_eagle3_head_drafts_what_the_reference_forward_computes(tmp_path, layout):
    model = tiny_llama(3, layers=4, sharpness=3.0)
    draft_ids = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:40].sort().values
    path = write_eagle3(tmp_path / layout, model, layout, draft_ids, layers=(2, 1, 3))
    drafter, logits = EagleDrafter(head=str(path), num_draft=4, adaptive=False), []
    steps = recorded_drafts(model, drafter, repetitive_prompt(3), logits=logits)
    assert drafter.needs_target_hidden == (2, 1, 3) and len(steps) >= 3
    w, prefix = _weights(path), "midlayer." if layout == "eagle3" else "layers.0."
    for (tokens, draft), rows in zip(steps, logits):
        tokens_ref, rows_ref = reference_eagle3(model, w, (2, 1, 3), tokens, len(draft), prefix)
        assert draft == tokens_ref
        for ours, reference in zip(rows, rows_ref):
            assert_same_logits(ours, reference)
        assert all(bool(w["t2d"][t]) for t in draft)  # only draft-vocabulary tokens


def test_eagle1_head_drafts_what_the_reference_forward_computes(tmp_path):
    model = tiny_llama(4, layers=2, sharpness=3.0)
    path = write_eagle1(tmp_path / "eagle1", model)
    drafter, logits = EagleDrafter(head=str(path), num_draft=3, adaptive=False), []
    steps = recorded_drafts(model, drafter, repetitive_prompt(4), logits=logits)
    assert drafter.needs_target_hidden is True and len(steps) >= 3
    for (tokens, draft), rows in zip(steps, logits):
        tokens_ref, rows_ref = reference_eagle1(model, _weights(path), tokens, len(draft))
        assert draft == tokens_ref
        for ours, reference in zip(rows, rows_ref):
            assert_same_logits(ours, reference)


@pytest.mark.parametrize("layers", [1, 2])
def test_medusa_heads_draft_what_the_reference_forward_computes(tmp_path, layers):
    model = tiny_llama(5, layers=2, sharpness=3.0)
    path = write_medusa(tmp_path / "medusa", model, heads=3, layers=layers)
    drafter = MedusaDrafter(heads=str(path))
    steps = recorded_drafts(model, drafter, repetitive_prompt(5))
    assert len(steps) >= 3
    w = _weights(path, "medusa_lm_head.safetensors")
    for tokens, draft in steps:
        assert draft == reference_medusa(model, w, 3, layers, tokens)[: len(draft)]


# -- lossless with every imported head ----------------------------------------------------------


def test_imported_heads_decode_exactly_as_plain_greedy(tmp_path):
    layouts = {
        "eagle3": lambda m, p: EagleDrafter(head=str(write_eagle3(p, m, "eagle3", torch.arange(0, 64, 2))),
                                            format="eagle3"),
        "speculators": lambda m, p: EagleDrafter(head=str(write_eagle3(p, m, "speculators")), tree="dynamic"),
        "eagle": lambda m, p: EagleDrafter(head=str(write_eagle1(p, m)), format="eagle"),
        "medusa": lambda m, p: MedusaDrafter(heads=str(write_medusa(p, m)), format="medusa"),
    }
    for name, make in layouts.items():
        counter = iter(range(100))

        def fresh(model, make=make, name=name, counter=counter):
            return make(model, tmp_path / f"{name}{next(counter)}")
        assert_greedy_identity(fresh, seeds=(0, 1), max_new_tokens=24)


def test_imported_eagle3_head_samples_exactly(tmp_path):
    """Speculators layout, a 6-of-8-token draft vocabulary (q is zero outside it, d2t offsets),
    T = 1, 1,000 samples: chi-square against the target's exact distribution."""
    model = sampling_model()
    path = write_eagle3(tmp_path / "s", model, "speculators", torch.tensor([0, 2, 3, 4, 6, 7]))
    drafter = EagleDrafter(head=str(path), num_draft=2, adaptive=False, sample=True)
    pvalue, decoder = sampling_pvalue(model, drafter, SETTINGS["t1"], samples=1000)
    assert pvalue > P_MIN
    assert 0 < decoder.drafter.length.acceptance() < 1


# -- export: a round trip gives the same drafts ---------------------------------------------------


def test_eagle3_layouts_convert_both_ways_with_identical_drafts(tmp_path):
    model = tiny_llama(6, layers=4, sharpness=3.0)
    original = write_eagle3(tmp_path / "orig", model, "eagle3", torch.arange(8, 56), layers=(1, 2, 3))
    head = load_published(original, model, "auto")
    save_eagle3(head, tmp_path / "spec", "speculators", verifier="tiny", dtype=torch.float32)
    save_eagle3(load_published(tmp_path / "spec", model, "auto"), tmp_path / "back", "eagle3", dtype=torch.float32)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    prompt = repetitive_prompt(6)
    drafts = [recorded_drafts(model, EagleDrafter(head=str(p), adaptive=False), prompt)
              for p in (original, tmp_path / "spec", tmp_path / "back")]
    assert drafts[0] and drafts[0] == drafts[1] == drafts[2]


def test_spec_zoo_medusa_heads_export_and_import_with_identical_drafts(tmp_path):
    model = tiny_llama(7, layers=2, sharpness=3.0)
    heads = MedusaHeads(model, 3, vocab_ids=torch.arange(4, 60, 3))
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(7))
    save_head(heads, tmp_path / "ours", {"name": "tiny"}, {})
    ours = load_head(MedusaHeads, tmp_path / "ours", model, "drafter.heads", "spec-zoo-train medusa")
    save_medusa(ours, tmp_path / "medusa", model.config.vocab_size, "tiny", dtype=model.dtype)
    theirs = load_published_medusa(tmp_path / "medusa", model)
    assert torch.equal(theirs.vocab_ids, ours.vocab_ids)
    states = torch.randn(5, model.config.hidden_size, dtype=model.dtype)
    assert torch.equal(theirs(states), ours(states))
    drafts = recorded_drafts(model, MedusaDrafter(heads=ours), repetitive_prompt(7))
    assert drafts and drafts == recorded_drafts(model, MedusaDrafter(heads=str(tmp_path / "medusa")),
                                                repetitive_prompt(7))


# -- bad files: one line naming the problem -----------------------------------------------------


def _fails(match, path, model, drafter=EagleDrafter, **kwargs):
    key = "heads" if drafter is MedusaDrafter else "head"
    with pytest.raises(ConfigError, match=match) as err:
        drafter(**{key: str(path)}, **kwargs).attach(Target(model))
    assert "\n" not in str(err.value)


def test_bad_published_heads_fail_in_one_line(tmp_path):
    model = tiny_llama(0, layers=2)
    _fails("missing layers.0.self_attn.q_proj", write_eagle3(tmp_path / "a", model, "speculators",
                                                             drop=["layers.0.self_attn.q_proj.weight"]), model)
    _fails("layers \\[0, 1, 5\\].*layers 0..1", write_eagle3(tmp_path / "b", model, "speculators", layers=(0, 1, 5)),
           model)
    _fails("hidden_size 32 but the target has 48", write_eagle3(tmp_path / "c", model, "eagle3"),
           tiny_llama(0, layers=2, hidden_size=48, intermediate_size=96))
    _fails("d2t maps draft tokens outside", write_eagle3(tmp_path / "d", model, "eagle3", torch.arange(10),
                                                          tensors={"d2t": torch.full((10,), 70)}), model)
    _fails("vocabulary of 64 tokens but the target has 80", write_eagle3(tmp_path / "e", model, "eagle3"),
           tiny_llama(0, layers=2, vocab=80))
    pickled = tmp_path / "f"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(_layer_config(model)))
    (pickled / "pytorch_model.bin").write_bytes(b"x")
    _fails("safetensors only, never pickles", pickled, model, format="eagle")
    _fails("medusa head, not an EAGLE head", write_medusa(tmp_path / "g", model), model)
    bad = write_medusa(tmp_path / "i", model, heads=2)
    (bad / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    _fails("do not match medusa_num_heads=3", bad, model, MedusaDrafter)
    _fails("vocabulary of 80 and hidden size 32", write_medusa(tmp_path / "j", model), tiny_llama(0, vocab=80),
           MedusaDrafter)
    with pytest.raises(ConfigError, match="drafter.format='eagle4'"):
        EagleDrafter(head=str(tmp_path / "a"), format="eagle4")


# -- spec-zoo-train export ------------------------------------------------------------------------


def _export_cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir

    from spec_zoo.registry import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train_export", overrides=[f"export.out={tmp_path / 'out'}", *overrides])


def test_export_writes_medusa_and_speculators_layouts_that_import_to_the_same_drafts(tmp_path):
    from spec_zoo.train.export import export

    model = tiny_llama(8, layers=4, sharpness=3.0)
    heads = MedusaHeads(model, 2, vocab_ids=torch.arange(0, 64, 2), train_head=True)
    save_head(heads, tmp_path / "ours", {"name": "tiny"}, {}, dtype=torch.float32)
    out = export(_export_cfg(tmp_path, "export.format=medusa", f"export.source={tmp_path / 'ours'}",
                             "export.dtype=float32"), target=Target(model))
    prompt = repetitive_prompt(8)
    drafts = recorded_drafts(model, MedusaDrafter(heads=str(tmp_path / "ours")), prompt)
    assert drafts and drafts == recorded_drafts(model, MedusaDrafter(heads=str(out)), prompt)
    original = write_eagle3(tmp_path / "e3", model, "eagle3", torch.arange(16, 64), layers=(2, 1, 0))
    out = export(_export_cfg(tmp_path, "export.format=speculators", f"export.source={original}",
                             "export.dtype=float32", f"export.out={tmp_path / 'spec'}"), target=Target(model))
    drafts = recorded_drafts(model, EagleDrafter(head=str(original), adaptive=False), prompt)
    assert drafts and drafts == recorded_drafts(model, EagleDrafter(head=str(out), format="speculators",
                                                                    adaptive=False), prompt)


def test_export_refuses_what_the_layout_cannot_hold_before_loading_a_model(tmp_path, monkeypatch, capsys):
    import sys

    import spec_zoo.api  # noqa: F401 (imported now, it binds the real load_target, not the patch below for good)
    from spec_zoo.train.cli import main

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)
    for args, words in ((["--format", "eagle4"], "export.format='eagle4'"),
                        (["--format=speculators"], "not a spec_zoo head: spec-zoo's EAGLE head reads")):
        monkeypatch.setattr(sys, "argv", ["spec-zoo-train", "export", *args])
        with pytest.raises(SystemExit) as done:
            main()
        err = capsys.readouterr().err.strip()
        assert done.value.code == 2 and len(err.splitlines()) == 1 and words in err, err
