"""The target at its own width (``model.weights``, `spec_zoo.runtime.quant_gemm.at_width`): a GGUF-born model
kept as its own codes is the same model, batch-invariant and lossless under speculation on the compiled
runtime; a float model is refused ``native`` by name and quantized (another model) at int8 / int4; bad
settings are refused before any load. One compiled tiny target serves the module."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from spec_zoo import SpeculativeDecoder
from spec_zoo.api import label
from spec_zoo.costs import what_costs
from spec_zoo.draft import Draft
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.models import check_model_config, load_target, on_runtime
from spec_zoo.runtime import CompiledTarget
from spec_zoo.runtime.host_fit import fit_weights
from spec_zoo.runtime.quant_gemm import GROUP, QuantLinear, at_width, dequantize, quantize, quantized_model
from spec_zoo.runtime.target import Target
from spec_zoo.testing import PROMPT, hf_greedy, sampling_model
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)


def gguf_born(model: nn.Module) -> nn.Module:
    """``model`` with every linear weight replaced by what a Q4_1 file (the output layer: Q8_0)
    dequantizes to, as the embedded targets' are."""
    head = model.get_output_embeddings()
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.in_features % GROUP == 0:
            bits = 8 if module is head else 4
            codes, scales, lows, _ = quantize(module.weight, bits)
            module.weight.data = dequantize(codes, scales, lows, bits)
    return model


@pytest.fixture(scope="module")
def born():
    return gguf_born(sampling_model().float())


@pytest.fixture(scope="module")
def native(born):
    target = on_runtime("compiled", born, weights="native", max_cache_len=96, key_block=16)
    target.warm_up()
    return target


def test_native_weights_are_the_models_own_bit_for_bit(born):
    """Every linear layer becomes codes whose dequantization is the loaded weight exactly; the
    model passed in keeps its float layers."""
    model = at_width(born, "native")
    originals = {name: m for name, m in born.named_modules() if isinstance(m, nn.Linear)}
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert quantized and quantized.keys() == originals.keys()
    for name, layer in quantized.items():
        assert torch.equal(layer.dequantized(), originals[name].weight)
    assert quantized["lm_head"].bits == 8 and {m.bits for n, m in quantized.items() if n != "lm_head"} == {4}


def test_a_quantized_graph_is_unfrozen_by_default_and_a_float_one_frozen(native, born):
    """``freezing: auto``: frozen weights for inductor's C++ GEMM over float linears; a quantized model's
    linears run spec-zoo's kernel, and unfrozen its graph is cached whole (a warm process starts sooner)."""
    assert native.settings["freezing"] is False
    assert CompiledTarget(born, max_cache_len=96).settings["freezing"] is True
    assert CompiledTarget(born, max_cache_len=96, freezing=False).settings["freezing"] is False
    with pytest.raises(ConfigError, match=r"model.freezing='yes'; use true, false or auto"):
        CompiledTarget(born, max_cache_len=96, freezing="yes")


def test_a_models_codes_are_searched_once_then_read_from_the_cache(born, tmp_path, monkeypatch):
    """The codes of a model found on one load are read back on the next (keyed by its weights and widths:
    the same buffers); other weights miss; a damaged entry is searched and written again."""
    from spec_zoo.runtime import quant_gemm

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(quant_gemm, "CACHED_FROM", 0)  # the test model is below the size worth caching
    searches = []
    search = quant_gemm._search
    monkeypatch.setattr(quant_gemm, "_search", lambda weight, bits: searches.append(bits) or search(weight, bits))

    def buffers(model):
        return {name: t for name, t in model.named_buffers() if name.rsplit(".", 1)[-1] in ("codes", "scales", "lows")}

    first = buffers(at_width(born, "native"))
    layers = len(searches)
    (entry,) = (tmp_path / "codes").iterdir()
    again = buffers(at_width(born, "native"))
    assert len(searches) == layers and first.keys() == again.keys()  # nothing searched: read back
    assert all(torch.equal(first[name], again[name]) for name in first)
    at_width(born, "int8")  # the same weights at other widths: another entry
    assert len(searches) == 2 * layers and len(list((tmp_path / "codes").iterdir())) == 2
    entry.write_bytes(entry.read_bytes()[:100])  # cut off
    damaged = buffers(at_width(born, "native"))
    assert len(searches) == 3 * layers and all(torch.equal(first[name], damaged[name]) for name in first)
    assert buffers(at_width(born, "native")).keys() == first.keys() and len(searches) == 3 * layers  # rewritten


def test_a_layer_at_its_own_width_reads_as_its_float_weight(born):
    """Code that reads a target's linear weight (a draft head sharing its output rows, a digest) gets the
    float32 weight it computes with, the loaded one bit for bit, made once."""
    head = at_width(born, "native").get_output_embeddings()
    assert isinstance(head, QuantLinear) and torch.equal(head.weight, born.get_output_embeddings().weight)
    assert head.weight is head.weight


def test_a_head_started_from_a_native_targets_layer_holds_its_float_weights(born):
    """An EAGLE head (or exit adapter) starts as a copy of a target layer: on a native target that copy is
    float layers with the loaded weights, so heads trained and stored on dense targets load on it."""
    from spec_zoo.drafters.eagle.head import EagleHead

    ours = EagleHead(born, 0).block.state_dict()
    theirs = EagleHead(at_width(born, "native"), 0).block.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_float_model_is_refused_native_and_quantized_as_another_at_int8_or_int4():
    model = sampling_model().float()
    with pytest.raises(ConfigError, match=r"weights=native keeps.*set model.weights=int8 or int4"):
        at_width(model, "native")
    for weights, bits in (("int8", 8), ("int4", 4)):
        layers = [m for m in at_width(model, weights).modules() if isinstance(m, QuantLinear)]
        assert layers and {m.bits for m in layers} == {bits}
    assert at_width(model, "dense") is model


def test_rows_are_batch_invariant_on_native_weights(native):
    """``buckets=auto`` runs one row as one (an unbacked row count), and its logits are those of
    every longer scoring's first row."""
    assert native.buckets == [1] and native.bucket(1) == 1
    native.reset()
    alone = native.score(PROMPT, Draft.empty()).logits[0]
    for m in range(1, 12):
        native.reset()
        assert torch.equal(native.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits[0], alone)


def test_native_plain_decoding_is_the_models_greedy_and_speculation_equals_it(native, born):
    """Plain decoding on native weights gives the model's own greedy tokens; ngram chains and
    trees give plain decoding's tokens exactly (the lossless contract on this width)."""
    plain = SpeculativeDecoder(native).generate(PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert plain.ids == hf_greedy(born, PROMPT, 24)
    for drafter in (NgramDrafter(num_draft=4), NgramDrafter(num_draft=3, branches=2, adaptive=False)):
        out = SpeculativeDecoder(native, drafter).generate(PROMPT, max_new_tokens=24, eos_token_ids=[])
        assert out.ids == plain.ids and out.stats.alpha > 0


def test_the_width_is_named_where_costs_are_kept(native):
    assert native.weights == "native" and what_costs(native)[1] == "compiled-native"


def test_a_model_at_its_own_width_is_made_again_at_another_for_the_quantized_draft(born):
    """`drafter=quantized` on a native target (the default on SmolLM2) gets int8-activation layers of the
    same codes, not a copy of the target's own layers."""
    native = at_width(born, "native")
    draft, layers, exact = quantized_model(native, activations="int8")
    theirs = {name: m for name, m in native.named_modules() if isinstance(m, QuantLinear)}
    ours = {name: m for name, m in draft.named_modules() if isinstance(m, QuantLinear)}
    assert layers == exact == len(ours) == len(theirs) and {m.activations for m in ours.values()} == {"int8"}
    assert all(torch.equal(m.dequantized(), theirs[name].dequantized()) and m.bits == theirs[name].bits
               for name, m in ours.items())


def test_auto_weights_are_native_for_a_model_held_as_codes_and_dense_otherwise(born):
    weights, model = fit_weights(born)
    assert weights == "native" and all(
        torch.equal(m.dequantized(), dict(born.named_modules())[name].weight)
        for name, m in model.named_modules() if isinstance(m, QuantLinear))
    float_model = sampling_model().float()
    assert fit_weights(float_model) == ("dense", float_model)
    double = gguf_born(sampling_model().double())  # codes, but not the kernel's float32
    assert fit_weights(double) == ("dense", double)
    with torch.no_grad():  # codes in each layer's first rows only: refused as a whole, and kept dense
        next(m for m in born.modules() if isinstance(m, nn.Linear)).weight[-1, 0] += 1e-3
    try:
        assert fit_weights(born)[0] == "dense"
    finally:
        gguf_born(born)


def test_auto_runtime_is_compiled_once_this_targets_graph_was_compiled(native, born, monkeypatch, capsys):
    """``native`` compiled these weights at these settings, which left its note: auto runs compiled; at
    another setting (or before any compile) it runs eager and says how to compile. The summary line
    names what each auto became."""
    monkeypatch.undo()  # conftest keeps auto eager in every other test
    settings = {"max_cache_len": 96, "key_block": 16}
    target = on_runtime("auto", born, weights="auto", **settings)
    assert isinstance(target, CompiledTarget) and target.weights == "native" and target.graph_note().exists()
    assert "warmup" not in capsys.readouterr().err
    other = on_runtime("auto", born, weights="auto", max_cache_len=80, key_block=16)
    assert type(other) is Target and other.weights == "native"
    assert "model.runtime=auto runs eager" in capsys.readouterr().err
    decoder = SpeculativeDecoder(target, NgramDrafter())
    cfg = OmegaConf.create({"model": {"runtime": "auto", "dtype": "float32", "weights": "auto"}})
    assert label(cfg, decoder, None) == ("drafter=ngram verifier=greedy (auto: temperature 0) runtime=compiled (auto) "
                                         "weights=native (auto)")


def test_auto_dtype_is_float32_on_the_cpu():
    check_model_config({"name": "smollm2-135m", "path": None, "dtype": "auto", "runtime": "compiled"})
    for weights in ("native", "int8", "int4", "auto"):  # widths that compute in float32 take the default dtype
        check_model_config({"name": "smollm2-135m", "path": None, "dtype": "auto", "weights": weights})
    assert load_target.__defaults__ is not None  # the function's own defaults stay named settings
    assert "auto" not in load_target.__defaults__


@pytest.mark.parametrize("cfg,message", [
    ({"weights": "fp4"}, r"model.weights='fp4'; use one of: dense, native, int4, int8"),
    ({"weights": "native", "dtype": "bfloat16"}, r"model.weights=native computes in float32"),
    ({"weights": "int8", "device": "cuda"}, r"CUDA is not available|model.weights=int8 runs on spec-zoo's CPU"),
])
def test_bad_settings_are_refused_before_a_load(cfg, message):
    with pytest.raises(ConfigError, match=message):
        check_model_config({"name": "smollm2-135m", "path": None, **cfg})
