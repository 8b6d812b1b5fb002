"""Peer engines in the bench (`spec_zoo.bench.peers`, `peer_method`): the adapter, its protocol and
its errors, on a stub engine (tests/stub_peer.py) in place of vLLM, which CI does not install."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from spec_zoo.bench.methods import build_method
from spec_zoo.bench.peer_method import PeerMethod, build_peer_method
from spec_zoo.bench.peers import PEERS
from spec_zoo.bench.specs import resolve_methods
from spec_zoo.bench.summary import OVERALL, summarize
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from tests.conftest import make_tiny_llama
from tests.test_bench import EOS, bench

STUB = Path(__file__).with_name("stub_peer.py")
BROKEN = {"vllm_broken": {"engine": "vllm", "params": {"speculative_config": {"method": "broken"}}}}


@pytest.fixture(scope="module")
def target():
    return Target(make_tiny_llama())


def venv_of_this_python(tmp_path, monkeypatch, engine: str) -> None:
    """A venv dir whose python is this one, named by SPEC_ZOO_<ENGINE>_VENV."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv(f"SPEC_ZOO_{engine.upper()}_VENV", str(tmp_path / "venv"))


@pytest.fixture
def stub_engine(tmp_path, monkeypatch):
    """The vllm engine's venv made of this python, its worker replaced by the stub."""
    venv_of_this_python(tmp_path, monkeypatch, "vllm")
    monkeypatch.setitem(PEERS, "vllm", dataclasses.replace(PEERS["vllm"], worker=str(STUB)))


def test_peer_methods_run_beside_ours_compared_with_their_own_plain_decoding(target, tmp_path, stub_engine):
    specs, _ = resolve_methods({"vllm_ngram": None, "ar": None, "vllm_ar": None, **BROKEN}, [])
    methods = [build_method(s, target, SamplingParams(), "h-ar", eos_token_ids=EOS) if s.engine == "spec_zoo"
               else build_peer_method(s, target, f"h-{s.name}", EOS) for s in specs]
    assert [(m.name, m.plain) for m in methods] == [
        ("ar", "ar"), ("vllm_ar", "ar"), ("vllm_ngram", "vllm_ar"), ("vllm_broken", "vllm_ar")]
    records = bench(target, methods, tmp_path / "results.jsonl")
    by = {}
    for r in records:
        by.setdefault(r["method"], []).append(r)
    assert {r["drafter"] for r in by["vllm_ngram"]} == {"ngram"} and by["vllm_ar"][0]["verifier"] == "vllm"
    assert all(r["matches_baseline"] is True for r in by["vllm_ngram"])  # equal to vllm_ar's output
    # its last token differs; a second turn after a different answer is another prompt: not compared
    assert [r["matches_baseline"] for r in by["vllm_broken"]] == [False, None, False]
    ngram = by["vllm_ngram"][0]
    assert ngram["target_forwards"] == ngram["new_tokens"] - ngram["accepted"]
    assert ngram["tau"] == pytest.approx(ngram["new_tokens"] / ngram["target_forwards"])
    summary = summarize(records)
    assert summary.get("vllm_ngram", OVERALL, "own_speedup") == pytest.approx(2.0)  # 0.01 s vs 0.02 s
    # a plain method's own plain decoding is the baseline's
    assert summary.get("vllm_ar", OVERALL, "own_speedup") == summary.get("vllm_ar", OVERALL, "speedup")
    assert "vllm_ngram over vllm_ar" in summary.to_markdown()
    for method in methods[1:]:
        method.close()


def test_a_peer_that_batches_takes_a_batch_in_one_call(target, tmp_path, stub_engine):
    """At batch_size 2 vLLM gets each group of questions in one request; every output equals its
    batch-1 output, and each record carries the batch's time."""
    specs, _ = resolve_methods({"ar": None, "vllm_ar": None}, [])
    methods = [build_method(s, target, SamplingParams(), "h-ar", eos_token_ids=EOS) if s.engine == "spec_zoo"
               else build_peer_method(s, target, f"h-{s.name}", EOS) for s in specs]
    alone = bench(target, methods, tmp_path / "one.jsonl")
    batched = bench(target, methods, tmp_path / "two.jsonl", batch_size=2)
    key = lambda r: (r["method"], r["question_id"], r["turn"])  # noqa: E731
    assert sorted(map(key, alone)) == sorted(map(key, batched))
    assert {key(r): r["output_ids"] for r in alone} == {key(r): r["output_ids"] for r in batched}
    peer = [r for r in batched if r["method"] == "vllm_ar" and r["turn"] == 1]
    assert [(r["batch_size"], r["batch_requests"], r["wall_s"]) for r in peer] == [(2, 2, 0.02), (2, 2, 0.02)]
    assert {key(r): r["matches_baseline"] for r in alone} == {key(r): r["matches_baseline"] for r in batched}
    methods[1].close()


def test_a_missing_peer_environment_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_ZOO_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"method vllm_ar: the vllm environment is missing .*`make peer-vllm`"):
        resolve_methods(["vllm_ar"], [])


def test_peer_speculation_needs_its_engines_plain_decoding_in_the_run(stub_engine):
    with pytest.raises(ConfigError, match="add a plain vllm method to methods"):
        resolve_methods(["vllm_ngram"], [])
    with pytest.raises(ConfigError, match="takes no drafter"):
        resolve_methods({"vllm_ar": {"drafter": "ngram"}}, [])


def test_a_worker_that_dies_is_one_line_quoting_its_last_words(target, stub_engine, monkeypatch):
    method = PeerMethod("vllm_ar", "vllm", {"venv": os.environ["SPEC_ZOO_VLLM_VENV"]}, "h", "crash", "float32")
    with pytest.raises(ConfigError, match=r"vllm_ar: the vllm worker exited \(3\): stub: cannot load the model"):
        method.run([3, 4], 4, 0)
    method.close()


FAKE_LLAMA_CPP = Path(__file__).with_name("fake_llama_cpp")
LLAMACPP = {"llamacpp_ar": None, "llamacpp_pld": {"method": "prompt_lookup", "num_pred_tokens": 4}}


@pytest.fixture
def llamacpp_venv(tmp_path, monkeypatch):
    """llama.cpp's venv made of this python; a GGUF stand-in file for params.model_path."""
    venv_of_this_python(tmp_path, monkeypatch, "llamacpp")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    return tmp_path / "model.gguf"


def test_llamacpp_worker_counts_forwards_and_drafts_on_the_fake_engine(target, tmp_path, llamacpp_venv, monkeypatch):
    """The real worker script on a fake llama_cpp with llama-cpp-python's loop: its prompt lookup is
    paired with its plain decoding, equal output, tau = new tokens / forwards, accepted <= drafted."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_LLAMA_CPP), os.environ.get("PYTHONPATH", "")]))
    specs, _ = resolve_methods({"ar": None, **{name: {"engine": "llamacpp", "params": {
        "model_path": str(llamacpp_venv), "speculative_config": spec}} for name, spec in LLAMACPP.items()}}, [])
    methods = [build_method(s, target, SamplingParams(), "h-ar", eos_token_ids=EOS) if s.engine == "spec_zoo"
               else build_peer_method(s, target, f"h-{s.name}", EOS) for s in specs]
    assert [(m.name, m.plain) for m in methods] == [
        ("ar", "ar"), ("llamacpp_ar", "ar"), ("llamacpp_pld", "llamacpp_ar")]
    plain, pld = methods[1].run([5, 9, 5], 12, 0), methods[2].run([5, 9, 5], 12, 0)
    assert plain.output_ids == pld.output_ids and len(pld.output_ids) == 12
    assert plain.fields["target_forwards"] == 12 and plain.fields["drafted"] is None
    # the fake's tokens cycle, so lookup drafts hit: fewer forwards than tokens
    assert 0 < pld.fields["accepted"] <= pld.fields["drafted"]
    assert pld.fields["target_forwards"] == 12 - pld.fields["accepted"] < 12
    assert methods[2].drafter == "prompt_lookup" and methods[2].version == "fake"
    records = bench(target, methods, tmp_path / "results.jsonl")
    assert all(r["matches_baseline"] is True for r in records if r["method"] == "llamacpp_pld")
    for method in methods[1:]:
        method.close()


def test_llamacpp_loads_the_gguf_the_embedded_target_was_converted_from(target, llamacpp_venv):
    from spec_zoo.models import converted_dir, embedded_gguf_of

    gguf = embedded_gguf_of(converted_dir("smollm2-135m"))
    assert gguf is not None and gguf.name.endswith(".gguf") and gguf.is_file()
    assert PEERS["llamacpp"].model({}, str(converted_dir("smollm2-135m")), "llamacpp_ar") == str(gguf)
    assert PEERS["vllm"].model({}, "some/dir", "vllm_ar") == "some/dir"
    assert PEERS["llamacpp"].engine_args({"venv": "v", "model_path": "m", "n_batch": 8}) == {"n_batch": 8}
    with pytest.raises(ConfigError, match=r"llamacpp_ar: llamacpp loads a GGUF file .* set params.model_path"):
        build_peer_method(resolve_methods(["llamacpp_ar"], [])[0][-1], target, "h", EOS)
    with pytest.raises(ConfigError, match=r"params.model_path=/nowhere.gguf is not a file"):  # while resolving
        resolve_methods({"llamacpp_ar": {"engine": "llamacpp", "params": {"model_path": "/nowhere.gguf"}}}, [])


def test_a_missing_llamacpp_environment_names_its_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_ZOO_LLAMACPP_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"llamacpp_ar: the llamacpp environment is missing .*`make peer-llamacpp`"):
        resolve_methods(["llamacpp_ar"], [])
