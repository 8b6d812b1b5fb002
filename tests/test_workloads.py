"""The acceptance report on prompts shaped like real use (issue 24), on a tiny target with a
character tokenizer: conversations carry the target's own first answer and a follow-up,
long-document categories keep only long prompts, the benchmark's questions never get in,
depth buckets split every position, and the comparison with a bench run counts its traces."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

from spec_zoo.bench.dataset import DATASETS
from spec_zoo.bench.records import read_records
from spec_zoo.drafters.eagle.train import train_eagle
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import read_utf8
from spec_zoo.registry import CONF_DIR
from spec_zoo.runtime.target import Target
from spec_zoo.train.bench_match import bench_position1, closeness
from spec_zoo.train.data import generate_batch
from spec_zoo.train.report import chain_alpha, run_report
from spec_zoo.train.workloads import workload_prompts
from tests.heads import teacher, train_cfg
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)


class ChatTokenizer:
    """Characters as token ids, a chat template that tags each turn: enough for conversations."""

    chat_template = "tags"
    eos_token_id, pad_token_id = 1, 0

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [ord(c) % 60 + 2 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids if not (skip_special_tokens and i == 1))


def _bench_turn() -> str:
    return json.loads(read_utf8(DATASETS["spec_bench"], "spec_bench").splitlines()[0])["turns"][0]


def _prompts_file(tmp_path):
    rows = [{"prompt": f"chat question number {i} about topic {i * 7}", "source": "chat-x"} for i in range(4)]
    rows += [{"prompt": "doc " + "word " * (30 + 15 * (i % 4)) + str(i), "source": "doc-y"} for i in range(12)]
    rows.append({"prompt": _bench_turn(), "source": "chat-x"})  # a Spec-Bench question: must never be used
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train_report", overrides=[
            f"data.prompts={_prompts_file(tmp_path)}", "report.prompts=workloads", "report.per_category=4",
            "~report.workloads", "+report.workloads={conv: {sources: [chat], follow_up: true}, "
            "long: {sources: [doc], min_tokens: 150}}", "report.follow_ups=[Say it shorter., Give an example.]",
            "report.max_prompt_tokens=400", f"data.cache_dir={tmp_path / 'cache'}", "data.max_new_tokens=12",
            "data.top_k=8", "data.batch_size=4", "progress=false", "threads=1", *overrides])
    return cfg


def _target():
    return Target(teacher(), tokenizer=ChatTokenizer())


def test_workloads_hold_conversations_long_documents_and_no_benchmark_question(tmp_path):
    cfg, target, tok = _cfg(tmp_path), _target(), ChatTokenizer()
    # every prompt of the file shares at least 8 words with the bench question, but only the copy is dropped
    trained = frozenset({"chat question number 3 about topic 21"})  # 3 chat prompts left: every one is read
    w = workload_prompts(target, cfg, exclude=trained)
    assert w.names == ["conv", "long"] and w.dropped == {"conv": 1, "long": 0}
    conv = [p for p, c in zip(w.prompts, w.categories) if c == 0]
    long = [p for p, c in zip(w.prompts, w.categories) if c == 1]
    assert len(conv) == 3 and len(long) == 4 and all(150 <= len(p) <= 400 for p in long)
    records = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    chats = [r["prompt"] for r in records if r["source"] == "chat-x"]

    def conversation(first: str, follow_up: str) -> list[int]:  # turn 1, the target's own greedy answer, follow-up
        return tok.apply_chat_template([{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                                        {"role": "user", "content": follow_up}])

    for i, ids in enumerate(conv):
        turn1 = [tok.apply_chat_template([{"role": "user", "content": t}])[:-11] for t in chats]
        head = [t for t, p in zip(chats, turn1) if ids[: len(p)] == p]
        assert len(head) == 1  # the first turn is one chat prompt; its answer, one row at a time:
        p = tok.apply_chat_template([{"role": "user", "content": head[0]}])
        one = generate_batch(target.model, [p], 12, 1, 0.0, [1], 0, 0)
        reply = tok.decode(one["ids"][0, len(p) : len(p) + int(one["gen_len"][0])].tolist())
        firsts = [t for t in head if ids == conversation(t, ["Say it shorter.", "Give an example."][i % 2])]
        assert len(firsts) == 1 and firsts[0] not in trained and firsts[0] != _bench_turn()
    with pytest.raises(ConfigError, match="report.follow_ups: .* shares 8 words with a benchmark question"):
        workload_prompts(target, _cfg(tmp_path, f"report.follow_ups=[{json.dumps(_bench_turn())}]"), trained)
    with pytest.raises(ConfigError, match="report.workloads.long: no held-out prompt"):
        workload_prompts(target, _cfg(tmp_path, "report.max_prompt_tokens=100"), trained)


def test_a_workload_takes_the_form_real_requests_take(tmp_path):
    """``strip`` removes a source's instruction (prompts it does not match are left out), ``form`` puts
    the rest in a request's own form; a bad regex or a form without {prompt} is refused in one line."""
    tok = ChatTokenizer()
    cfg = _cfg(tmp_path, "+report.workloads.long.strip='^doc word '",
               "+report.workloads.long.form='Summarize: {prompt}'")
    w = workload_prompts(_target(), cfg, exclude=frozenset())
    docs = [json.loads(line)["prompt"] for line in (tmp_path / "prompts.jsonl").read_text().splitlines()
            if json.loads(line)["source"] == "doc-y"]
    expected = {tuple(tok.apply_chat_template([{"role": "user", "content": "Summarize: " + d[len("doc word "):]}]))
                for d in docs}
    long = [tuple(p) for p, c in zip(w.prompts, w.categories) if c == 1]
    assert len(long) == 4 and set(long) <= expected
    with pytest.raises(ConfigError, match="report.workloads.long: no held-out prompt"):
        workload_prompts(_target(), _cfg(tmp_path, "+report.workloads.long.strip='^nothing like it'"), frozenset())
    # a list applies each regex in turn: only the docs ending in 1 or 2 match the second one
    w = workload_prompts(_target(), _cfg(tmp_path, "+report.workloads.long.strip=['^doc word ','[12]$']"), frozenset())
    long = [tuple(p) for p, c in zip(w.prompts, w.categories) if c == 1]
    kept = {tuple(tok.apply_chat_template([{"role": "user", "content": d[len("doc word "):-1].strip()}]))
            for d in docs if d[-1] in "12"}
    assert long and set(long) <= kept
    # a category of its own file: only that file's prompts
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"prompt": "doc " + "other " * 40 + str(i), "source": "doc-q"})
                               for i in range(5)))
    w = workload_prompts(_target(), _cfg(tmp_path, f"+report.workloads.long.file={other}"), frozenset())
    long = [tuple(p) for p, c in zip(w.prompts, w.categories) if c == 1]
    assert len(long) == 4
    theirs = {tuple(tok.apply_chat_template([{"role": "user", "content": json.loads(x)["prompt"]}]))
              for x in other.read_text().splitlines()}
    assert set(long) <= theirs
    with pytest.raises(ConfigError, match="report.workloads.long.file: nope.jsonl does not exist"):
        workload_prompts(_target(), _cfg(tmp_path, "+report.workloads.long.file=nope.jsonl"), frozenset())
    with pytest.raises(ConfigError, match=r"report.workloads.long.form: .* has no \{prompt\}"):
        workload_prompts(_target(), _cfg(tmp_path, "+report.workloads.long.form='Summarize:'"), frozenset())
    with pytest.raises(ConfigError, match="report.workloads.long.strip: .* is not a regular expression"):
        workload_prompts(_target(), _cfg(tmp_path, "+report.workloads.long.strip='(unclosed'"), frozenset())


def test_chains_split_by_depth_bucket_add_up_to_all_of_them():
    matches = torch.tensor([[True, True], [False, True], [True, False], [True, False], [True, True]])
    local, gen = torch.arange(5), torch.full((5,), 5)
    whole = chain_alpha(matches, local, gen)
    parts = [chain_alpha(matches, local, gen, 0, 2), chain_alpha(matches, local, gen, 2)]
    assert whole == [(3, 4), (2, 3)]  # chains at 0..3; position 2 of chain r is matches[r + 1, 1]
    assert parts == [[(1, 2), (1, 1)], [(2, 2), (1, 2)]]
    assert [tuple(map(sum, zip(*col))) for col in zip(*parts)] == whole


def _bench_run(tmp_path):
    """A bench run: category conv (question 1, turns 1 and 2) and long (question 2)."""
    run = tmp_path / "bench"
    run.mkdir()
    results = [{"schema_version": 1, "method": "eagle_x", "question_id": q, "turn": t, "category": c}
               for q, t, c in [(1, 1, "conv"), (1, 2, "conv"), (2, 1, "long")]]
    steps = [("eagle_x", 1, 1, [0, 2, 1], [1, 3, 1]), ("eagle_x", 1, 2, [1, 1], [2, 1]),
             ("eagle_x", 2, 1, [1, 1, 1, 1], [1, 1, 1, 1]), ("other", 2, 1, [1], [2])]
    traces = [{"method": m, "question_id": q, "turn": t, "steps": {"drafted": d, "committed": c}}
              for m, q, t, d, c in steps]
    (run / "results.jsonl").write_text("\n".join(json.dumps(r) for r in results))
    (run / "traces.jsonl").write_text("\n".join(json.dumps(t) for t in traces))
    return run


def test_bench_position_one_comes_from_the_traces_and_closeness_is_measured(tmp_path):
    run = _bench_run(tmp_path)
    got = bench_position1(run, "eagle_x")
    assert got == {"conv": (2, 4), "all": (2, 8), "conv turn 2": (1, 2), "long": (0, 4)}
    c = closeness({"a": 0.5, "b": 0.2, "c": 0.9, "all": 0.1}, {"a": 0.4, "b": 0.3, "c": 0.8, "d": 0.0, "all": 0.9})
    assert c["categories"] == ["a", "b", "c"] and c["spearman"] == pytest.approx(1.0)
    assert c["mean_abs_diff"] == pytest.approx(0.1) and c["max_abs_diff"] == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="no traces of bench method 'nope'"):
        bench_position1(run, "nope")
    # the runs kept in docs/ are gzipped: the same counts from results.jsonl.gz and traces.jsonl.gz
    for name in ("results.jsonl", "traces.jsonl"):
        (run / f"{name}.gz").write_bytes(gzip.compress((run / name).read_bytes()))
        (run / name).unlink()
    assert bench_position1(run, "eagle_x") == got
    assert read_records(run / "results.jsonl.gz")[0]["category"] == "conv"


def test_workload_report_runs_end_to_end_with_depth_buckets_and_the_bench_beside_it(tmp_path):
    head = train_eagle(train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.steps=5",
                                 "data.forced_prompts=0"), target=Target(teacher()))
    cfg = _cfg(tmp_path, f"report.artefacts=[{head}]", f"report.out={tmp_path / 'out'}", "report.depth_buckets=[0,4,8]",
               f"report.compare.results={_bench_run(tmp_path)}", "report.compare.methods={head: eagle_x}")
    md = run_report(cfg, target=_target())
    result = json.loads((md.parent / "acceptance.json").read_text())
    res = result["artefacts"][str(head)]
    assert result["settings"]["prompts"] == {"conv": 4, "long": 4} and result["settings"]["kind"] == "workloads"
    assert set(result["settings"]["bench_overlap_dropped"]) == {"conv", "long"}
    for cat in ("conv", "long", "all"):  # the buckets split every chain of the category
        by = res["by_depth"][cat]
        assert list(by) == ["all", "0-3", "4-7", "8+"] and by["all"] == res["alpha"][cat]
        for s in range(3):
            assert [sum(by[b][s][k] for b in ("0-3", "4-7", "8+")) for k in (0, 1)] == by["all"][s]
    assert res["by_depth"]["all"]["8+"][0][1] > 0  # answers are scored past the first 8 tokens
    bench = res["bench"]
    assert bench["method"] == "eagle_x" and bench["categories"] == ["conv", "long"]
    ours = {c: res["alpha"][c][0][0] / res["alpha"][c][0][1] for c in ("conv", "long")}
    assert bench["mean_abs_diff"] == pytest.approx((abs(ours["conv"] - 0.5) + abs(ours["long"] - 0.0)) / 2)
    text = md.read_text()
    assert "By depth in the answer" in text and "| 0-3 | 4-7 | 8+ |" in text and "| eagle_x (bench) |" in text
    assert (md.parent / "against_bench.png").stat().st_size > 0 and "(against_bench.png)" in text
    # an artefact benchmarked in another run names that run; the default run is then not needed
    other = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "bench", other)
    md = run_report(_cfg(tmp_path, f"report.artefacts=[{head}]", f"report.out={tmp_path / 'out2'}",
                         f"report.compare.methods={{head: {{results: {other}, method: eagle_x}}}}"), target=_target())
    again = json.loads((md.parent / "acceptance.json").read_text())["artefacts"][str(head)]["bench"]
    assert again["run"] == str(other) and again["mean_abs_diff"] == pytest.approx(bench["mean_abs_diff"])
    with pytest.raises(ConfigError, match="report.compare.methods.head: no bench run"):
        run_report(_cfg(tmp_path, f"report.artefacts=[{head}]", "report.compare.methods={head: eagle_x}"),
                   target=_target())
    with pytest.raises(ConfigError, match="report.compare.methods names \\['nothere'\\]"):
        run_report(_cfg(tmp_path, f"report.artefacts=[{head}]", f"report.compare.results={tmp_path / 'bench'}",
                        "report.compare.methods={nothere: eagle_x}"), target=_target())
    with pytest.raises(ConfigError, match="report.depth_buckets"):
        run_report(_cfg(tmp_path, f"report.artefacts=[{head}]", "report.depth_buckets=[4,8]"), target=_target())


def test_a_document_trained_on_in_another_template_is_not_held_out(tmp_path):
    """A held-out prompt sharing ``report.train_ngram`` + 7 words with a training prompt is dropped
    (its document was trained on under another instruction); a run more than three training
    prompts share is an instruction, and keeps nothing out."""
    import random

    rng = random.Random(0)
    articles = [" ".join(f"w{rng.randrange(500)}" for _ in range(60)) for _ in range(6)]
    boiler = " ".join(f"b{i}" for i in range(30))  # an instruction four training prompts share
    mine = tmp_path / "docs.jsonl"
    mine.write_text("\n".join(json.dumps({"prompt": f"{boiler} {a}", "source": "doc-y"}) for a in articles))
    trained = frozenset({"TL;DR of this: " + articles[0] + " Thanks."} | {f"{boiler} other {j}" for j in range(4)})
    cfg = _cfg(tmp_path, f"data.prompts={mine}", "~report.workloads", "+report.workloads={long: {sources: [doc]}}",
               "report.per_category=6", "report.max_prompt_tokens=4000")
    w = workload_prompts(_target(), cfg, exclude=trained)
    assert w.seen == {"long": 1} and len(w.prompts) == 5
    tok = ChatTokenizer()
    assert tuple(tok.apply_chat_template([{"role": "user", "content": f"{boiler} {articles[0]}"}])) not in {
        tuple(p) for p in w.prompts}
    w = workload_prompts(_target(), _cfg(tmp_path, f"data.prompts={mine}", "~report.workloads", "report.train_ngram=0",
                                         "+report.workloads={long: {sources: [doc]}}", "report.per_category=6",
                                         "report.max_prompt_tokens=4000"), exclude=trained)
    assert w.seen == {"long": 0} and len(w.prompts) == 6  # exact texts only: the document gets back in
