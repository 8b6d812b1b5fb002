"""spec-zoo-bench as a user runs it, in subprocesses on a tiny random Llama (with the
default target's tokenizer) and a JSONL of prompts (dataset=jsonl): a run killed mid-way
(SIGKILL) resumes with no duplicate and no lost record; a real Hydra multirun through
hydra-submitit-launcher's submitit_local mode writes one results file per job, and
spec-zoo-report merges them into one report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from spec_zoo.bench.records import read_records, record_key
from tests.conftest import make_tiny_llama

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox",
           "one two three four one two three four one two",
           "Caches store keys and values. Caches store",
           "Speculative decoding drafts tokens and verifies them."]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random Llama with the default target's tokenizer (vocab 49152), saved as a model dir."""
    import torch

    from spec_zoo.models import embedded_model_dir

    src = embedded_model_dir()
    out = tmp_path_factory.mktemp("tiny_model")
    model = make_tiny_llama(vocab_size=49152, hidden_size=16, intermediate_size=32, eos_token_id=2)
    model.to(torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": p, "kind": "a" if i % 2 else "b"}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def bench_args(model_dir, prompts_path, *extra):
    return ["model=local", f"model.path={model_dir}", "dataset=jsonl", f"dataset.path={prompts_path}",
            "dataset.prompt_field=text", "dataset.category_field=kind", "generation.chat=false",
            "progress=false", "warmup_tokens=2", *extra]


def run(args, timeout=300, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "spec_zoo.bench.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **kw)


def test_killed_run_resumes_without_duplicates_or_losses(tiny_model, prompts, tmp_path):
    out = tmp_path / "out"
    slow = "{drafter:{_target_:tests.slow_drafter.SlowNoDrafter,delay:0.03}}"
    args = bench_args(tiny_model, prompts, f"methods={{slow:{slow},ngram:null}}", "repeats=3",
                      "generation.max_new_tokens=16", f"out={out}")
    results = out / "results.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "spec_zoo.bench.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 5:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        killed = read_records(results)
    expected = len(PROMPTS) * 3 * 3  # prompts x repeats x methods (ar, slow, ngram)
    assert 5 <= len(killed) < expected

    done = run(args)
    assert done.returncode == 0, done.stderr[-3000:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a line cut by SIGKILL is skipped with a warning
        stored = read_records(results)
    keys = [record_key(r) for r in stored]
    assert len(keys) == len(set(keys)) == expected
    assert {tuple(map(json.dumps, record_key(r))) for r in killed} <= {tuple(map(json.dumps, k)) for k in keys}
    assert {(r["method"], r["question_id"], r["repeat"]) for r in stored} == {
        (m, q, rep) for m in ("ar", "slow", "ngram") for q in range(1, len(PROMPTS) + 1) for rep in range(3)}
    assert {r["category"] for r in stored} == {"a", "b"} and all(r["threads"] >= 1 for r in stored)
    again = run(args)  # nothing left: no new record
    assert again.returncode == 0 and len(read_records(results)) == len(stored)


def test_submitit_local_multirun_merges_into_one_report(tiny_model, prompts, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=submitit_local_bench", f"hydra.sweep.dir={tmp_path / 'hydra'}",
            *bench_args(tiny_model, prompts, "methods=[ngram]", "+method_params.num_draft=2,4",
                        "generation.max_new_tokens=8", f"out={out}")]
    proc = run(args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    files = sorted(out.rglob("results.jsonl"))
    assert len(files) == 2 and [f.parent.name.split(",")[0] for f in files] == [
        "+method_params.num_draft=2", "+method_params.num_draft=4"]
    for f, k in zip(files, (2, 4)):
        records = read_records(f)
        assert len(records) == 2 * len(PROMPTS)  # ar + ngram, one job each
        assert {r["params"].get("num_draft") for r in records if r["method"] == "ngram"} == {k}
        assert all(r["matches_baseline"] for r in records if r["method"] == "ngram")

    from spec_zoo.report.cli import main as report_main

    assert report_main([str(out), "-o", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| ngram [num_draft=2] |" in text and "| ngram [num_draft=4] |" in text
    assert "2 results file(s)" in text
    assert (tmp_path / "report" / "figures" / "speedup_by_category.png").is_file()
    assert (tmp_path / "report" / "figures" / "speedup_vs_draft_length.png").is_file()

    rerun = run(args, timeout=600)  # finished work is skipped: no new records
    assert rerun.returncode == 0
    assert [len(read_records(f)) for f in files] == [2 * len(PROMPTS)] * 2


def test_joblib_multirun_dry_run_plans_every_job(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = run(["-m", "hydra/launcher=joblib_bench", f"hydra.sweep.dir={tmp_path / 'hydra'}", "--dry-run",
                "methods=[ngram]", "+method_params.num_draft=2,4", "dataset.per_category=1", f"out={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # joblib workers print to their own stdout; the job dirs are named in the launcher's log
    assert "+method_params.num_draft=2" in proc.stdout + proc.stderr
    assert "+method_params.num_draft=4" in proc.stdout + proc.stderr
