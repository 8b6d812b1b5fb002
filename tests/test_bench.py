"""spec-zoo-bench: dataset grouping/subsampling, method resolution, record schema, resume,
summary math. A tiny random Llama stands in for the target; prompts are token ids."""

from __future__ import annotations

import json

import pytest
import torch

from spec_zoo.bench.dataset import CATEGORIES, Question, load_questions, prompt_encoder
from spec_zoo.bench.methods import Measurement, Method, build_method
from spec_zoo.bench.records import FIELDS, SCHEMA_VERSION, read_records, record_key
from spec_zoo.bench.runner import run_benchmark, run_context
from spec_zoo.bench.specs import resolve_methods
from spec_zoo.bench.summary import OVERALL, summarize, summarize_file
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from tests.conftest import make_tiny_llama

EOS = [1]
QUESTIONS = [
    Question(90, "mt_bench", ((5, 6, 7, 5, 6, 7, 5), (9, 10, 11))),  # two turns
    Question(300, "qa", ((12, 13, 14, 12, 13),)),
]
TURN_RECORDS = sum(len(q.turns) for q in QUESTIONS)


def concat(turns, answers):
    """The token-id stand-in for a chat: turn 1, answer 1, turn 2, ..."""
    ids = []
    for i, turn in enumerate(turns):
        ids += list(turn) + (answers[i] if i < len(answers) else [])
    return ids


@pytest.fixture(scope="module")
def target():
    return Target(make_tiny_llama())


@pytest.fixture
def draft_cache(tmp_path, monkeypatch):
    """A tiny draft model where drafter/small_model.yaml looks for the truncated draft."""
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))
    make_tiny_llama(seed=1, num_hidden_layers=1).save_pretrained(tmp_path / "smollm2-135m-trunc4")
    return tmp_path


class OffByOne(Method):
    """Greedy decoding whose last token is wrong: a method that never matches the baseline."""

    def __init__(self, baseline: Method):
        super().__init__("off_by_one", "none", "greedy", {}, "h-off")
        self.baseline = baseline

    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        measured = self.baseline.run(prompt_ids, max_new_tokens, seed)
        ids = measured.output_ids[:-1] + [(measured.output_ids[-1] + 1) % 64]
        return Measurement(ids, measured.fields)


def build(target, names, **kw):
    specs, _ = resolve_methods(names, [])
    sampling = SamplingParams()
    return [build_method(s, target, sampling, s.config_hash({}), eos_token_ids=EOS, **kw) for s in specs]


def bench(target, methods, path, **kw):
    kw = {"max_new_tokens": 8, "warmup_tokens": 2, "progress": False, **kw}
    context = run_context("tiny", "test", 0.0, target.device)
    return run_benchmark(methods, QUESTIONS, concat, path, target=target, context=context, **kw)


# -- dataset ------------------------------------------------------------------------
def test_spec_bench_groups_mt_bench_and_subsamples_deterministically():
    everything = load_questions()
    assert len(everything) == 480
    assert {q.category for q in everything} == set(CATEGORIES)
    mt = [q for q in everything if q.category == "mt_bench"]
    assert [q.question_id for q in mt] == list(range(81, 161)) and all(len(q.turns) == 2 for q in mt)

    two = load_questions(per_category=2)
    assert len(two) == 2 * len(CATEGORIES)
    assert all(sum(q.category == c for q in two) == 2 for c in CATEGORIES)
    assert two == load_questions(per_category=2)  # deterministic
    assert set(two) <= set(load_questions(per_category=5))  # growing a run keeps its questions
    assert [q.question_id for q in two] == sorted(q.question_id for q in two)
    assert {q.category for q in load_questions(per_category=1, categories=["qa", "rag"])} == {"qa", "rag"}


def test_the_continuation_track_is_plain_text_for_a_base_model():
    """Documents and code cut mid-way, one turn each; a tokenizer without a chat template gets the text as is."""
    questions = load_questions("continuation")
    assert {q.category for q in questions} == {"document", "code"} and all(len(q.turns) == 1 for q in questions)

    class Decoder:
        target = type("T", (), {"tokenizer": type("Tok", (), {"chat_template": None})()})()

        def encode(self, text, chat):
            assert not chat
            return [len(text)]

    assert prompt_encoder(Decoder())(questions[0].turns, []) == [len(questions[0].turns[0])]


def test_dataset_errors(tmp_path):
    with pytest.raises(ConfigError, match="available: spec_bench"):
        load_questions("nope")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="no questions"):
        load_questions(path=str(empty))
    with pytest.raises(ConfigError, match=r"dataset.categories: spec_bench has no \['poetry'\]; choose from .*qa"):
        load_questions(categories=["poetry"])
    with pytest.raises(ConfigError, match="per_category"):
        load_questions(per_category=0)


def test_prompt_encoder_puts_the_method_answer_between_turns():
    class Tok:
        chat_template = "yes"

        def decode(self, ids, skip_special_tokens):
            return "answer:" + ",".join(map(str, ids))

    class Decoder:
        target = type("T", (), {"tokenizer": Tok()})()

        def encode_chat(self, messages):
            self.messages = messages
            return [1, 2]

    decoder = Decoder()
    assert prompt_encoder(decoder)(("hi", "again"), [[7, 8]]) == [1, 2]
    assert decoder.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "answer:7,8"},
        {"role": "user", "content": "again"},
    ]


# -- methods ------------------------------------------------------------------------
def test_unknown_method_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"'nope' is unknown; available: ar, .*hf_ar.*ngram"):
        resolve_methods(["nope"], [])
    with pytest.raises(ConfigError, match="drafter='nope' is unknown"):
        resolve_methods({"mine": {"drafter": "nope"}}, [])


def test_draft_models_need_no_setup_and_a_missing_one_is_an_error_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "nothing"))
    specs, notes = resolve_methods(None, ["ar", "ngram", "small_model", "hf_assisted"])
    assert [s.name for s in specs] == ["ar", "ngram", "small_model", "hf_assisted"] and not notes  # made on first use
    missing = {"mine": {"drafter": "small_model", "params": {"path": str(tmp_path / "nope")}}}
    with pytest.raises(ConfigError, match="does not exist; point drafter.path"):
        resolve_methods(missing, [])


def test_baseline_first_inline_methods_and_overrides():
    specs, _ = resolve_methods(
        {"ngram": None, "mine": {"drafter": {"_target_": "spec_zoo.drafters.ngram.NgramDrafter", "num_draft": 2}}}, []
    )
    assert [s.name for s in specs] == ["ar", "ngram", "mine"]
    mine = specs[2]
    assert mine.drafter_label == "spec_zoo.drafters.ngram.NgramDrafter" and mine.record_params == {"num_draft": 2}
    ngram8, = resolve_methods({"ngram": {"params": {"num_draft": 8}}}, [])[0][1:]
    assert ngram8.drafter["num_draft"] == 8 and ngram8.config_hash({}) != specs[1].config_hash({})


def test_compiled_methods_run_on_the_compiled_runtime_and_hash_apart():
    specs, _ = resolve_methods(["ngram", "ngram_compiled", "ar_compiled", "hf_ar_static"], [])
    runtimes = {s.name: s.runtime for s in specs}
    assert runtimes == {"ar": None, "ngram": None, "ngram_compiled": "compiled", "ar_compiled": "compiled",
                        "hf_ar_static": None}
    ngram, compiled = specs[1], specs[2]
    assert ngram.drafter == compiled.drafter and ngram.config_hash({}) != compiled.config_hash({})
    assert specs[4].params == {"cache_implementation": "static"}


def test_a_method_sets_its_own_dtype_and_is_compared_with_the_plain_decoding_of_that_dtype():
    fp32 = {"runtime": "compiled", "model": {"dtype": "float32", "gemm": "inductor"}}
    specs, _ = resolve_methods({"ar_compiled": None, "ngram_compiled": None,
                                "ar_compiled_fp32": {"drafter": "none", **fp32},
                                "ngram_compiled_fp32": {"drafter": "ngram", **fp32}}, [])
    by = {s.name: s for s in specs}
    assert by["ngram_compiled"].plain == "ar_compiled" and by["ngram_compiled_fp32"].plain == "ar_compiled_fp32"
    assert by["ngram_compiled_fp32"].model == {"dtype": "float32", "gemm": "inductor"}
    settings = {"model": {"dtype": "bfloat16"}}
    assert by["ngram_compiled_fp32"].config_hash(settings) != by["ngram_compiled"].config_hash(settings)
    assert by["ngram_compiled"].config_hash(settings) == resolve_methods(["ngram_compiled"], [])[0][1].config_hash(
        settings)  # records made before the key existed still resume
    with pytest.raises(ConfigError, match="may set the target's dtype, gemm, attention"):
        resolve_methods({"x": {"drafter": "none", "model": {"path": "elsewhere"}}}, [])
    with pytest.raises(ConfigError, match="other engines run the run's model settings"):
        resolve_methods({"vllm_ar": {"model": {"dtype": "float32"}}}, [])


def test_each_dtype_gets_its_own_copy_of_the_weights_and_its_own_target(target):
    from omegaconf import OmegaConf

    from spec_zoo.bench.cli import runtime_targets, target_name

    model_cfg = OmegaConf.create({"runtime": "eager", "dtype": "float64", "gemm": "inductor"})
    specs, _ = resolve_methods({"ngram": None, "ar_bf16": {"drafter": "none", "model": {"dtype": "bfloat16"}},
                                "ngram_bf16": {"drafter": "ngram", "model": {"dtype": "bfloat16"}}}, [])
    targets = runtime_targets(target, specs, model_cfg)
    names = [target_name(s, model_cfg) for s in specs]
    assert names == ["eager", "eager", "eager dtype=bfloat16", "eager dtype=bfloat16"]
    assert targets["eager"] is target and target.model.dtype == torch.float64  # the run's own weights untouched
    bf16 = targets["eager dtype=bfloat16"]
    assert bf16.model.dtype == torch.bfloat16 and bf16.model is not target.model
    a, b = target.model.lm_head.weight, bf16.model.lm_head.weight
    assert torch.equal(a.to(torch.bfloat16), b)


def test_method_entries_resolve_interpolations(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))
    (tmp_path / "other-draft").mkdir()
    entry = {"drafter": "small_model", "params": {"path": "${oc.env:SPEC_ZOO_CACHE}/other-draft"}}
    spec = resolve_methods({"mine": entry}, [])[0][1]
    assert spec.draft_model_path == f"{tmp_path}/other-draft" == spec.record_params["path"]


@pytest.mark.parametrize("same_vocab", [True, False])
def test_an_assistant_of_another_vocabulary_runs_as_universal_assisted_generation(monkeypatch, draft_cache,
                                                                                   same_vocab):
    """`hf_assisted_cross`: an assistant whose tokenizer differs from the target's is handed to
    transformers with assistant_tokenizer= and tokenizer= (universal assisted generation, the peer
    of drafter=cross_tokenizer); one of the same vocabulary is plain assisted generation."""
    from types import SimpleNamespace

    import spec_zoo.models

    def tokenizer(vocab):
        return SimpleNamespace(get_vocab=lambda: vocab)

    ours, theirs = tokenizer({"a": 0, "b": 1}), tokenizer({"a": 0, "b": 1} if same_vocab else {"ab": 0})
    monkeypatch.setattr(spec_zoo.models, "load_causal_lm", lambda *a, **k: (make_tiny_llama(seed=1), theirs))
    method = build(Target(make_tiny_llama(), ours), ["hf_assisted_cross"])[-1]  # after the baseline, ar
    assert "assistant_model" in method.kwargs
    if same_vocab:
        assert "assistant_tokenizer" not in method.kwargs
    else:
        assert method.kwargs["assistant_tokenizer"] is theirs and method.kwargs["tokenizer"] is ours


# -- runner ---------------------------------------------------------------------------
def test_records_follow_the_contract(target, tmp_path, draft_cache):
    methods = build(target, ["hf_ar", "ngram", "hf_pld", "small_model", "small_model_tree", "hf_assisted"])
    methods.append(OffByOne(methods[0]))
    records = bench(target, methods, tmp_path / "results.jsonl")
    assert records == read_records(tmp_path / "results.jsonl")
    assert len(records) == TURN_RECORDS * len(methods)
    assert all(list(r) == list(FIELDS) for r in records)
    json.dumps(records)  # all plain JSON
    by = {(r["method"], r["question_id"], r["turn"]): r for r in records}
    ar = by["ar", 90, 1]
    assert ar["tau"] == 1.0 and ar["alpha"] is None and ar["target_forwards"] == ar["new_tokens"]
    assert ar["category"] == "mt_bench" and ar["prompt_tokens"] == 7 and ar["new_tokens"] == len(ar["output_ids"])
    assert by["ar", 90, 2]["prompt_tokens"] == 7 + len(ar["output_ids"]) + 3  # turn 2 follows the own answer
    for name in ("ngram", "small_model", "small_model_tree", "hf_ar", "hf_pld", "hf_assisted"):
        assert all(by[name, q, t]["matches_baseline"] is True for q, t in [(90, 1), (90, 2), (300, 1)]), name
    assert by["small_model_tree", 300, 1]["drafter"] == "small_model_tree"
    assert by["small_model_tree", 300, 1]["params"]["tree_width"] == 2
    hf = by["hf_assisted", 300, 1]
    assert hf["tau"] is None and hf["target_forwards"] is None and hf["verifier"] == "transformers"
    assert hf["params"]["assistant_model"].endswith("smollm2-135m-trunc4")
    assert by["hf_pld", 300, 1]["drafter"] == "prompt_lookup"
    off = by["off_by_one", 300, 1]
    assert off["matches_baseline"] is False and off["top2_margin_at_mismatch"] > 0
    # its turn 2 follows a different answer than the baseline's: not comparable
    assert by["off_by_one", 90, 2]["matches_baseline"] is None


def test_interrupted_run_resumes_without_duplicates_or_losses(target, tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    methods = build(target, ["ngram", "hf_ar"])
    expected = TURN_RECORDS * len(methods) * 2

    seen = []

    def interrupt(record):
        seen.append(record)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench(target, methods, path, repeats=2, on_record=interrupt)
    assert len(read_records(path)) == 4
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "method": "ar", "quest')  # a write cut short by the interruption

    new = []
    records = bench(target, methods, path, repeats=2, on_record=new.append)
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == [f"warning: {path} line 5: cut short by an interrupted write; ignored (a rerun into the same "
                       "out= measures it again)."]  # one line, no source path of spec-zoo's
    assert len(new) == expected - 4 and len(records) == expected
    stored = read_records(path)
    keys = [record_key(r) for r in stored]
    assert len(keys) == len(set(keys)) == expected
    assert {(r["method"], r["question_id"], r["turn"], r["repeat"]) for r in stored} == {
        (m.name, q.question_id, t, rep)
        for m in methods for q in QUESTIONS for t in range(1, len(q.turns) + 1) for rep in range(2)
    }
    again = []
    bench(target, methods, path, repeats=2, on_record=again.append)
    assert again == []  # nothing left to measure


class FailsOn(Method):
    """Greedy decoding that raises on the prompts starting with a given token, as a peer engine's
    bug does (transformers' universal assisted generation on code openings)."""

    def __init__(self, baseline: Method, first_token: int):
        super().__init__("fails_on", "none", "greedy", {}, "h-fails")
        self.baseline, self.first_token = baseline, first_token

    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        if prompt_ids[0] == self.first_token:
            raise RuntimeError("cannot reshape tensor of 0 elements")
        return self.baseline.run(prompt_ids, max_new_tokens, seed)


def test_a_method_that_fails_on_a_question_is_logged_and_the_run_goes_on(target, tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    ar = build(target, ["ar"])[0]
    failing = FailsOn(ar, first_token=5)  # question 90 (two turns) fails at its first turn, in both repeats
    records = bench(target, [ar, failing], path, repeats=2)
    assert "failed on question(s) 90 turn 1 repeat 0: RuntimeError: cannot reshape" in capsys.readouterr().err
    mine = [r for r in records if r["method"] == "fails_on"]
    assert {(r["question_id"], r["turn"]) for r in mine} == {(300, 1)} and len(mine) == 2  # no turn 2 of 90
    assert all(r["matches_baseline"] for r in mine)
    failures = read_records(tmp_path / "failures.jsonl")
    assert [(f["method"], f["question_id"], f["turn"], f["repeat"]) for f in failures] == [
        ("fails_on", 90, 1, 0), ("fails_on", 90, 1, 1)]
    assert "cannot reshape" in failures[0]["traceback"] and failures[0]["category"] == "mt_bench"
    warning = [w for w in summarize_file(path).warnings if "fails_on" in w]
    assert len(warning) == 1 and "failed on 2 question turn(s) (mt_bench 2)" in warning[0]

    failing.first_token = -1  # fixed: a rerun measures what failed, and the warning goes
    new = []
    bench(target, [ar, failing], path, repeats=2, on_record=new.append)
    assert {(r["method"], r["question_id"], r["turn"]) for r in new} == {("fails_on", 90, 1), ("fails_on", 90, 2)}
    assert not [w for w in summarize_file(path).warnings if "fails_on" in w]


def test_the_baselines_failure_stops_the_run(target, tmp_path):
    ar = build(target, ["ar"])[0]
    failing = FailsOn(ar, first_token=12)
    failing.name = "ar"
    with pytest.raises(RuntimeError, match="cannot reshape"):
        bench(target, [failing], tmp_path / "results.jsonl")


def test_a_batched_run_decodes_each_group_as_one_batch_with_every_output_its_batch_1_output(target, tmp_path):
    methods = build(target, ["ar", "ngram"])
    alone = bench(target, methods, tmp_path / "one.jsonl")
    batched = bench(target, methods, tmp_path / "two.jsonl", batch_size=2)

    def key(r):
        return r["method"], r["question_id"], r["turn"], r["repeat"]

    assert {key(r): r["output_ids"] for r in batched} == {key(r): r["output_ids"] for r in alone}
    assert all(r["matches_baseline"] for r in batched) and len(batched) == len(alone)
    # turn 1: both questions side by side; turn 2: only the two-turn question is left
    assert sorted((r["method"], r["turn"], r["batch_requests"]) for r in batched) == sorted(
        (m, t, n) for m in ("ar", "ngram") for t, n in ((1, 2), (1, 2), (2, 1)))
    for turn1 in ([r for r in batched if r["method"] == m and r["turn"] == 1] for m in ("ar", "ngram")):
        assert turn1[0]["batch_wall_s"] == turn1[1]["batch_wall_s"] >= max(r["wall_s"] for r in turn1)
    dtype = str(target.dtype).removeprefix("torch.")
    assert {(r["batch_size"], r["dtype"]) for r in batched} == {(2, dtype)} and batched[0]["isa"]
    assert {r["batch_size"] for r in alone} == {1}
    seen = []
    bench(target, methods, tmp_path / "two.jsonl", batch_size=2, on_record=seen.append)
    assert seen == []  # complete batches are not measured again


def test_throughput_against_batch_size_pairs_each_method_with_plain_at_its_batch(tmp_path):
    from spec_zoo.bench.batches import throughput_table, write_batches

    def rec(method, size, repeat, tokens, batch_s, requests, plain="ar", match=True):
        return {"method": method, "batch_size": size, "repeat": repeat, "new_tokens": tokens, "wall_s": batch_s,
                "batch_wall_s": batch_s, "batch_requests": requests, "plain": plain, "matches_baseline": match,
                "lossless": True}

    records = []
    for repeat, jitter in ((0, 1.0), (1, 1.1)):
        records += [rec("ar", 1, repeat, 100, 10 * jitter, 1), rec("ngram", 1, repeat, 100, 5 * jitter, 1)]
        # batch 4: four requests of 100 tokens each, side by side
        records += [rec("ar", 4, repeat, 100, 20 * jitter, 4) for _ in range(4)]
        records += [rec("ngram", 4, repeat, 100, 16 * jitter, 4, match=i > 0) for i in range(4)]
    table = throughput_table(records)
    assert table["ar", 1]["tok_s"] == pytest.approx((10 + 100 / 11) / 2)
    assert table["ar", 4]["x_batch_1"] == pytest.approx(2.0)  # 400 tokens in 20 s against 100 in 10 s
    assert table["ngram", 4]["speedup"] == pytest.approx(20 / 16)
    assert table["ngram", 1]["speedup"] == pytest.approx(2.0)
    assert table["ngram", 4]["equal"] == [6, 8] and table["ar", 4]["ci"] > 0
    with pytest.raises(ConfigError, match="batches: .* holds no results.jsonl; pass the out= of a sweep"):
        write_batches(tmp_path)


def test_a_sweep_is_tabulated_and_plotted_from_its_results_files(target, tmp_path):
    from spec_zoo.bench.batches import write_batches

    methods = build(target, ["ar", "ngram"])
    for size in (1, 2):
        bench(target, methods, tmp_path / f"batch_size={size}" / "results.jsonl", batch_size=size)
    text = write_batches(tmp_path).read_text()
    assert "| ngram | 2 |" in text and "| ar | 1 |" in text and "| 3/3 |" in text
    assert (tmp_path / "throughput.png").stat().st_size > 0 and (tmp_path / "speedup.png").stat().st_size > 0


# -- summary --------------------------------------------------------------------------
def rec(method, category, qid, new_tokens, wall_s, forwards=None, drafted=None, accepted=None, match=None):
    return {"schema_version": SCHEMA_VERSION, "method": method, "category": category, "question_id": qid, "turn": 1,
            "repeat": 0,
            "new_tokens": new_tokens, "wall_s": wall_s, "target_forwards": forwards, "drafted": drafted,
            "accepted": accepted, "matches_baseline": match, "config_hash": method}


def test_summary_pools_tokens_and_seconds(tmp_path):
    records = [
        rec("ar", "qa", 1, 10, 1.0, 10, 0, 0, True), rec("ar", "qa", 2, 10, 1.0, 10, 0, 0, True),
        rec("ar", "rag", 3, 10, 2.0, 10, 0, 0, True),
        rec("ngram", "qa", 1, 10, 0.5, 5, 8, 6, True), rec("ngram", "qa", 2, 10, 0.5, 5, 8, 4, False),
        rec("ngram", "rag", 3, 10, 0.5, 2, 10, 8, True),
        rec("hf_pld", "qa", 1, 20, 1.0),  # ran one prompt only: compared with ar on that prompt
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = summarize_file(path)
    assert s.methods == ["ar", "ngram", "hf_pld"] and s.categories == ["qa", "rag", OVERALL]
    assert s.get("ngram", "qa", "speedup") == pytest.approx(2.0)  # 20 tok/s over 10 tok/s
    assert s.get("ngram", "rag", "speedup") == pytest.approx(4.0)
    assert s.get("ngram", OVERALL, "speedup") == pytest.approx((30 / 1.5) / (30 / 4.0))  # pooled, not mean of ratios
    assert s.get("hf_pld", "qa", "speedup") == pytest.approx(2.0) and s.get("hf_pld", "rag", "speedup") is None
    assert s.get("ar", OVERALL, "speedup") == 1.0
    ngram_qa = s.cells["ngram", "qa"]
    assert ngram_qa.tau == pytest.approx(2.0) and ngram_qa.alpha == pytest.approx(10 / 16)
    assert ngram_qa.match_rate == 0.5 and s.cells["ngram", OVERALL].tau == pytest.approx(30 / 12)
    assert s.cells["hf_pld", "qa"].tau is None and s.cells["hf_pld", "qa"].match_rate is None
    md = s.to_markdown()
    assert "| ngram | 2.00x | 4.00x | 2.67x |" in md and "| hf_pld | 2.00x | - | 2.00x |" in md
    assert not s.warnings
    mixed = summarize(records + [{**records[3], "config_hash": "other"}])
    assert "mixes 2 configurations" in mixed.warnings[0]


# -- command line -------------------------------------------------------------------
def bench_config(*overrides):
    from hydra import compose, initialize_config_dir

    from spec_zoo.registry import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("bench", overrides=list(overrides))


@pytest.mark.parametrize(
    "override, message",
    [("methods=[nope]", "'nope' is unknown; available"), ("dataset.name=nope", "available: spec_bench"),
     ("dataset.categories=[poetry]", "has no \\['poetry'\\]; choose from"), ("repeats=0", "repeats")],
)
def test_cli_rejects_bad_input_before_loading_a_model(override, message, tmp_path, monkeypatch):
    from spec_zoo.bench.cli import bench as run_cli

    def refuse(**_):
        raise AssertionError("the target was loaded before the bad input was rejected")

    monkeypatch.setattr("spec_zoo.models.load_target", refuse)
    with pytest.raises(ConfigError, match=message):
        run_cli(bench_config(override, f"out={tmp_path}"))


def test_cli_summarize_writes_summary_next_to_the_results(tmp_path):
    from spec_zoo.bench.cli import bench as run_cli

    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec("ar", "qa", 1, 10, 1.0, 10)) + "\n")
    summary = run_cli(bench_config(f"summarize={path}", f"out={tmp_path}"))
    assert summary.get("ar", "qa", "speedup") == 1.0
    assert "| ar | 1.00x | 1.00x |" in (tmp_path / "summary.md").read_text()


# -- ablation features ----------------------------------------------------------------
def test_jsonl_dataset_brings_your_own_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "hi", "kind": "x", "id": 7}\n{"text": ["a", "b"], "kind": "y", "id": 9}\n')
    qs = load_questions("jsonl", str(path), prompt_field="text", category_field="kind", id_field="id")
    assert qs == [Question(7, "x", ("hi",)), Question(9, "y", ("a", "b"))]
    plain = load_questions("jsonl", str(path), prompt_field="text", category_field=None, id_field=None)
    assert [(q.question_id, q.category) for q in plain] == [(1, "all"), (2, "all")]
    with pytest.raises(ConfigError, match="dataset.prompt_field=prompt"):
        load_questions("jsonl", str(path), prompt_field="prompt", category_field=None, id_field=None)
    with pytest.raises(ConfigError, match="dataset=jsonl needs dataset.path"):
        load_questions("jsonl", None)


@pytest.mark.parametrize(
    "overrides, message",
    [(["dataset=jsonl"], "dataset=jsonl needs dataset.path"),
     (["dataset=jsonl", "dataset.path=EMPTY"], "no questions"),
     (["methods={g:{drafter:ngram,verifier:greedy}}", "generation.temperature=0.7"],
      "method g: verifier=greedy only works at generation.temperature=0"),
     (["methods=[ngram_compiled]", "model.dtype=float64"], "methods.ngram_compiled.runtime=compiled computes in"),
     (["methods={n:{drafter:ngram,runtime:turbo}}"], "method n: runtime='turbo'; a spec_zoo method runs on one of"),
     (["methods={n:{engine:transformers,runtime:compiled}}"], "method n: runtime='compiled'"),
     (["methods={n:{drafter:none,runtime:compiled,model:{dtype:float64}}}"], "methods.n.runtime=compiled computes in"),
     (["methods={n:{drafter:none,runtime:compiled,model:{dtype:float32,gemm:amx}}}"],
      "methods.n: gemm='amx' with dtype=float32"),
     (["methods={n:{drafter:none,model:{weights:native}}}", "model.dtype=bfloat16"],
      "methods.n.weights=native computes in float32"),
     (["methods=[ar_native]", "model.weights=int8"],
      "methods.ar_native: weights=native, but the run loads model.weights=int8"),
     (["batch_size=4", "batch_policy=fastest"], "batch_policy: 'fastest' is not a policy")],
)
def test_cli_rejects_more_bad_input_before_loading_a_model(overrides, message, tmp_path, monkeypatch):
    from spec_zoo.bench.cli import bench as run_cli

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("target loaded"))
    (tmp_path / "empty.jsonl").write_text("")
    overrides = [o.replace("EMPTY", str(tmp_path / "empty.jsonl")) for o in overrides]
    with pytest.raises(ConfigError, match=message):
        run_cli(bench_config(*overrides, f"out={tmp_path}"))


def test_cli_refuses_a_results_file_of_another_schema_and_keeps_it(tmp_path, monkeypatch):
    from spec_zoo.bench.cli import bench as run_cli

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("target loaded"))
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({**rec("ar", "qa", 1, 10, 1.0, 10), "schema_version": 0}) + "\n")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="schema_version=0.*new out= directory"):
        run_cli(bench_config("methods=[ngram]", f"out={tmp_path}"))
    with pytest.raises(ConfigError, match="schema_version=0"):
        run_cli(bench_config(f"summarize={path}", f"out={tmp_path}"))
    assert path.read_bytes() == before


def test_dry_run_prints_the_plan_and_skips_done_work(tmp_path, monkeypatch, capsys):
    from spec_zoo.bench.cli import bench as run_cli

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("target loaded"))
    assert run_cli(bench_config("dry_run=true", "methods=[ngram]", "dataset.per_category=1",
                                "+method_params.num_draft=3", f"out={tmp_path}")) is None
    text = capsys.readouterr().out
    assert "plan: 6 prompts (7 turns) in 6 categories" in text
    assert "| ngram | ngram | num_draft=3 | 7 | 0 | 7 | 0.0400 (guess) |" in text
    assert "to run: 14 generations" in text and not (tmp_path / "results.jsonl").exists()
