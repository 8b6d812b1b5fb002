"""Model loading: the embedded target's one-time conversion, safe cache writes, and the
truncated draft."""

from __future__ import annotations

import pytest
import torch

import spec_zoo.models as models
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target


@pytest.mark.real_model
def test_embedded_target_converts_once_and_matches_the_gguf(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))
    gguf_loads = []
    real_load_gguf = models.load_gguf
    monkeypatch.setattr(models, "load_gguf", lambda name: gguf_loads.append(real_load_gguf(name)) or gguf_loads[-1])

    first = models.load_target()
    assert len(gguf_loads) == 1
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    # no temp dir left (the lock file that lets one process at a time convert stays, empty)
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == ["smollm2-135m-instruct"]
    second = models.load_target()
    assert len(gguf_loads) == 1  # served from the cache

    gguf_model, tokenizer = gguf_loads[0]
    ids = torch.tensor([tokenizer("Speculative decoding is")["input_ids"]])
    with torch.no_grad():
        expected = gguf_model(ids).logits
        assert torch.equal(first.model(ids).logits, expected)
        assert torch.equal(second.model(ids).logits, expected)
    assert second.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert second.tokenizer.chat_template == tokenizer.chat_template


@pytest.mark.real_model
def test_embedded_target_is_an_instruct_model(smollm2_target):
    assert isinstance(smollm2_target, Target)
    assert smollm2_target.model.config.num_hidden_layers == 30
    assert smollm2_target.tokenizer.chat_template
    assert smollm2_target.dtype == torch.float32


def test_interrupted_save_leaves_no_cache(tiny_llama, tmp_path):
    class BrokenTokenizer:
        def save_pretrained(self, _):
            raise KeyboardInterrupt

    out = tmp_path / "model"
    with pytest.raises(KeyboardInterrupt):
        models._save_atomically(out, tiny_llama(), BrokenTokenizer())
    assert list(tmp_path.iterdir()) == []


def test_local_dir_round_trip_without_tokenizer(tiny_llama, tmp_path):
    model = tiny_llama()
    models._save_atomically(tmp_path / "m", model)
    loaded, tokenizer = models.load_causal_lm(tmp_path / "m", dtype="float64")
    assert tokenizer is None
    assert not list((tmp_path / "m").glob("*.bin"))  # safetensors only
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_truncated_draft_keeps_embeddings_norm_and_head(tiny_llama, tmp_path):
    model = tiny_llama(num_hidden_layers=3)
    out = models.make_truncated_draft(model, 2, tmp_path / "draft")
    draft, _ = models.load_causal_lm(out, dtype="float64")
    assert draft.config.num_hidden_layers == 2
    ours, theirs = draft.state_dict(), model.state_dict()
    assert set(ours) == {k for k in theirs if ".layers.2." not in k}
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_truncated_draft_needs_fewer_layers_than_the_target(tiny_llama, tmp_path):
    with pytest.raises(ConfigError, match="--layers=2"):
        models.make_truncated_draft(tiny_llama(), 2, tmp_path / "draft")


def test_auto_device():
    assert models.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("device_map", ["cpu", {"": "cpu"}, "sequential"])
def test_device_map_passes_to_transformers_and_speculation_matches_plain(tiny_llama, tmp_path, device_map,
                                                                         monkeypatch):
    """``model.device_map`` is transformers' own placement (accelerate); on this machine every map
    lands on the CPU, and speculation over the placed target still equals plain greedy decoding."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from drafters.ngram import NgramDrafter
    from spec_zoo.decoder import SpeculativeDecoder

    model = tiny_llama()
    models._save_atomically(tmp_path / "m", model)
    given = OmegaConf.create(device_map) if isinstance(device_map, dict) else device_map  # as Hydra hands it
    seen = []
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: seen.append(k.get("device_map")) or real(cls, *a, **k)))
    target = models.load_target(path=str(tmp_path / "m"), device_map=given)
    assert seen == [device_map] and type(seen[0]) is type(device_map)  # transformers gets a plain dict, not Hydra's
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    plain = SpeculativeDecoder(models.load_target(path=str(tmp_path / "m"))).generate(prompt, 24, eos_token_ids=[])
    out = SpeculativeDecoder(target, NgramDrafter()).generate(prompt, 24, eos_token_ids=[])
    assert out.ids == plain.ids


@pytest.mark.parametrize("device_map, runtime, complaint", [
    ("auto", "compiled", "needs the eager runtime"),
    ("gpu", "eager", "'gpu' is not a device"),
    (3.5, "eager", "neither a strategy"),
    pytest.param("cuda:0", "eager", "CUDA is not available", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")),
])
def test_a_device_map_that_cannot_work_is_refused_before_any_load(tiny_llama, tmp_path, device_map, runtime,
                                                                  complaint, monkeypatch):
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: pytest.fail("loaded before the check"))
    with pytest.raises(ConfigError, match=complaint):
        models.load_target(path=str(tmp_path), device_map=device_map, runtime=runtime)


@pytest.mark.real_model
def test_the_prepared_device_check_runs_here(tmp_path):
    """docs/devices/check.py is what a lent GPU window runs (issue 25's CUDA bf16 leg): it must work
    before that window, so it runs here on the CPU, through a device map, and finds plain == speculative."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("device_check", Path(__file__).parents[1] / "docs/devices/check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    out = tmp_path / "cpu.json"
    assert check.main(["--device-map", "cpu", "--dtype", "float32", "--drafters", "none,ngram,eagle",
                       "--prompts", "2", "--tokens", "12", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["device"] == "cpu" and found["device_map"] == "cpu"
    assert [r["equal"] + r["near_tie"] for r in found["drafters"].values()] == [2, 2, 2]
    assert found["drafters"]["ngram"]["forwards"] <= found["drafters"]["none"]["forwards"]
    assert torch.is_grad_enabled()  # the check leaves the process as it found it (later tests train)
