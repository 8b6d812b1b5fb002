"""Model loading: the embedded target's one-time conversion, safe cache writes, and the
truncated draft."""

from __future__ import annotations

import pytest
import torch

import spec_zoo.models as models
from spec_zoo.errors import ConfigError
from spec_zoo.target import Target


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
