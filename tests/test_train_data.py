"""Teacher data at scale (issue 13), on tiny random targets: batched generation equals the
one-at-a-time path, the shared store refuses another target or mixture and resumes,
training-time test trains the EAGLE head's deeper draft positions, and the acceptance
report runs end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spec_zoo.drafters.eagle.train import train_eagle, ttt_mask
from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from spec_zoo.runtime.target import Target
from spec_zoo.train.data import generate_batch
from spec_zoo.train.mixture import categories, mixture_prompts, mixture_texts
from spec_zoo.train.report import run_report
from spec_zoo.train.store import BudgetSpent, TeacherSet
from spec_zoo.train.translations import english_sentences, looks_german
from tests.heads import teacher, train_cfg
from tests.test_distill import _prompts
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

# Log-probabilities are stored as float16; batched and single-row forwards differ in the
# last float32 bits only, so stored values agree to within float16 rounding (~1e-3 relative).
LOGP_TOL = 1e-2


def test_batched_generation_equals_one_prompt_at_a_time():
    model = teacher()
    prompts = _prompts(8, seed=5)  # 3..8 tokens: left padding differs per row
    batched = generate_batch(model, prompts, 24, 8, 0.0, [1], 0, 0)
    assert len({len(p) for p in prompts}) > 1 and int(batched["gen_len"].min()) < 24  # a row stopped at its EOS
    for i, p in enumerate(prompts):
        one = generate_batch(model, [p], 24, 8, 0.0, [1], 0, 0)
        g = int(one["gen_len"][0])
        assert int(batched["gen_len"][i]) == g
        assert batched["ids"][i, : len(p) + g].tolist() == one["ids"][0, : len(p) + g].tolist()
        assert torch.equal(batched["topk_ids"][i, :g], one["topk_ids"][0, :g])
        diff = (batched["topk_logp"][i, :g].float() - one["topk_logp"][0, :g].float()).abs().max()
        assert diff <= LOGP_TOL


def _data_cfg(tmp_path, *overrides, config="train_distill"):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config, overrides=["data.max_new_tokens=8", "data.batch_size=4", "data.top_k=8",
                                         f"data.cache_dir={tmp_path / 'cache'}", "progress=false", *overrides])
    OmegaConf.update(cfg, "data.token_ids", _prompts(20))
    return cfg


def test_store_refuses_another_target_or_mixture_or_settings(tmp_path):
    model = teacher()
    TeacherSet(_data_cfg(tmp_path), Target(model), 20).fill(12, progress=False)
    with pytest.raises(ConfigError, match="holds teacher data of target .*set data.store to another directory"):
        TeacherSet(_data_cfg(tmp_path), Target(teacher(seed=4)), 20)
    other = _data_cfg(tmp_path)
    OmegaConf.update(other, "data.token_ids", _prompts(20, seed=1))
    with pytest.raises(ConfigError, match="another prompt mixture .*set data.store to another directory"):
        TeacherSet(other, Target(model), 20)
    with pytest.raises(ConfigError, match="another generation settings \\(differs in max_new_tokens\\)"):
        TeacherSet(_data_cfg(tmp_path, "data.max_new_tokens=9"), Target(model), 20)


def test_store_resumes_keeping_written_shards_and_grows(tmp_path):
    model = teacher()
    teacher_set = TeacherSet(_data_cfg(tmp_path), Target(model), 20)
    store = teacher_set.store
    first = teacher_set.store.fill(model, teacher_set.prompts[:12], teacher_set.categories[:12], batch_size=4,
                                   eos_ids=[1], pad_id=0, seed=0, shard_prompts=4, progress=False)
    shards = sorted(p for p in store.root.iterdir() if p.name.startswith("shard-"))
    assert [p.name for p in shards] == [f"shard-{a:07d}-{a + 4:07d}.safetensors" for a in (0, 4, 8)]
    shards[2].unlink()  # an interrupted fill: the last shard never landed
    stamps = {p.name: p.stat().st_mtime_ns for p in shards[:2]}
    again = TeacherSet(_data_cfg(tmp_path), Target(model), 20)
    more = again.store.fill(model, again.prompts, again.categories, batch_size=4, eos_ids=[1], pad_id=0, seed=0,
                            shard_prompts=4, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in shards[:2]} == stamps  # kept, not regenerated
    assert len(more) == 20 and torch.equal(more.ids[:12, : first.ids.shape[1]], first.ids)
    assert json.loads((store.root / "manifest.json").read_text())["sequences"] == 20
    states = again.store.states("final", lambda ids: {"final": model.model(input_ids=ids).last_hidden_state}, 4)
    one = model.model(input_ids=more.ids[3:4, : int(more.prompt_len[3] + more.gen_len[3])]).last_hidden_state[0]
    assert len(states) == 20 and torch.allclose(states[3], one, atol=1e-5)
    assert again.store.states("final", None, 4)[3].equal(states[3])  # read back, not recomputed


def _store_contents(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return {p.name: load_file(p) for p in sorted(root.glob("*.safetensors"))}


def test_data_budget_stops_after_a_shard_and_reruns_make_the_uninterrupted_store(tmp_path, monkeypatch):
    """``data.budget_s`` spent at once: each run writes one shard (teacher data, then target
    states) and stops, saying how far it got; rerunning the same command until it finishes
    leaves the store an uninterrupted run makes, tensor for tensor (sampled, so a resumed shard
    generated with another seed would differ)."""
    model = teacher()
    monkeypatch.setattr(TeacherSet, "shard_prompts", 4)
    final = lambda ids: {"final": model.model(input_ids=ids).last_hidden_state}  # noqa: E731

    def run(where, *overrides):
        ts = TeacherSet(_data_cfg(tmp_path / where, "data.temperature=1.0", *overrides), Target(model), 20)
        ts.fill(12, progress=False)
        return ts.store.states("final", final, 4, progress=False), ts.store.root

    whole, root = run("whole")
    stops = []
    while True:
        try:
            parts, resumed = run("stretches", "data.budget_s=1e-9")
            break
        except BudgetSpent as e:
            stops.append(str(e))
    assert [re.sub(r" in .*;", ";", m) for m in stops] == [
        f"data.budget_s=1e-09: {what} of {n} of 12 prompts done; nothing is lost: rerun the same command to continue"
        for what in ("teacher data", "target states (final)") for n in (4, 8)]
    assert sorted(p.name for p in root.glob("shard-*.safetensors")) == [
        f"shard-{a:07d}-{a + 4:07d}{kind}.safetensors" for a in (0, 4, 8) for kind in (".final", "")]
    a, b = _store_contents(root), _store_contents(resumed)
    assert a.keys() == b.keys() and all(a[f].keys() == b[f].keys() for f in a)
    assert all(torch.equal(a[f][k], b[f][k]) for f in a for k in a[f])
    assert all(torch.equal(x, y) for x, y in zip(whole, parts, strict=True))
    assert (root / "manifest.json").read_text() == (resumed / "manifest.json").read_text().replace(
        str(tmp_path / "stretches"), str(tmp_path / "whole"))


def test_a_negative_data_budget_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"data.budget_s=-1; use 0 \(no budget\)"):
        TeacherSet(_data_cfg(tmp_path, "data.budget_s=-1"), Target(teacher()), 20)
    assert not (tmp_path / "cache").exists()  # before the store opened


class _Tokenizer:
    """Characters as token ids: enough for the mixture without a real tokenizer."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 50 + 2 for c in text]}


def test_mixture_keeps_shares_in_every_prefix_and_holds_out_the_other_end(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"{src} prompt {i}", "source": src} for src in ("chat-a", "code-b", "math-c") for i in range(30)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = OmegaConf.create({"data": {"prompts": str(path), "use_mixture": True, "sources": None, "chat": False,
                                     "max_prompt_tokens": 64, "seed": 0, "mixture": {
                                         "chat": {"share": 0.5, "sources": ["chat"]},
                                         "code": {"share": 0.25, "sources": ["code"]},
                                         "math": {"share": 0.25, "sources": ["math"]}}}})
    cats = categories(cfg.data)
    prompts, _, taken = mixture_prompts(_Tokenizer(), cfg.data, cats, 40)
    assert taken == {"chat": 20, "code": 10, "math": 10}
    shorter = mixture_prompts(_Tokenizer(), cfg.data, cats, 8)
    assert shorter[0] == prompts[:8] and sorted(shorter[1]) == [0, 0, 0, 0, 1, 1, 2, 2]
    held = mixture_prompts(_Tokenizer(), cfg.data, cats, 12, heldout=frozenset())
    assert not {tuple(p) for p in held[0]} & {tuple(p) for p in prompts[:40]}  # the far end: disjoint here
    # ... but not once training takes most of a category; excluding the trained texts keeps it held out
    trained = mixture_texts(_Tokenizer(), cfg.data, cats, 50)  # 25 of the 30 chat prompts
    assert [_Tokenizer()(t)["input_ids"] for t in trained[:40]] == prompts
    near = mixture_prompts(_Tokenizer(), cfg.data, cats, 12, heldout=frozenset())[0]
    assert {tuple(p) for p in near} & {tuple(_Tokenizer()(t)["input_ids"]) for t in trained}
    apart = mixture_prompts(_Tokenizer(), cfg.data, cats, 12, heldout=frozenset(trained))[0]
    assert apart and not {tuple(p) for p in apart} & {tuple(_Tokenizer()(t)["input_ids"]) for t in trained}
    cfg.data.sources = ["chat"]
    with pytest.raises(ConfigError, match="data.use_mixture=false"):
        categories(cfg.data)


def test_ttt_mask_sees_what_a_depth_s_draft_sees():
    m = ttt_mask(5, 2, torch.float32, "cpu")[0, 0] == 0  # step 2 (depth 3): keys of steps 0, 1, 2
    assert m[4].tolist() == [True, True, True, False, False] + [False] * 3 + [True, False] + [False] * 4 + [True]
    assert (ttt_mask(4, 0, torch.float32, "cpu")[0, 0] == 0).equal(torch.ones(4, 4, dtype=torch.bool).tril())


def _ttt_cfg(tmp_path, ttt):
    cfg = train_cfg("train_eagle", tmp_path, "head.vocab_size=48", f"head.ttt_steps={ttt}", "train.steps=60",
                    "train.eval_every=60", "data.forced_prompts=0", "data.max_new_tokens=24",
                    f"output.dir={tmp_path / f'ttt{ttt}'}")
    OmegaConf.update(cfg, "data.token_ids", _prompts(96))
    return cfg


def test_training_time_test_raises_acceptance_at_depths_two_and_three(tmp_path):
    """Same data, steps and seed: unrolling over the head's own features (k = 3) trains the
    positions it drafts from them; plain training (k = 1) only the first."""
    model = teacher()
    runs = {k: json.loads((train_eagle(_ttt_cfg(tmp_path, k), target=Target(model)) / "eagle.json").read_text())
            for k in (1, 3)}
    ttt, plain = runs[3], runs[1]
    assert ttt["heldout_after"]["loss"] < ttt["heldout_before"]["loss"]
    assert ttt["config"]["head"]["ttt_steps"] == 3
    for depth in (2, 3):
        gain = ttt["heldout_after"][f"alpha_depth{depth}"] - plain["heldout_after"][f"alpha_depth{depth}"]
        assert gain > 0.02, (depth, gain)


def test_acceptance_report_runs_on_a_tiny_model(tmp_path):
    model = teacher()
    head = train_eagle(train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.steps=10",
                                 "data.forced_prompts=0"), target=Target(model))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train_report", overrides=[
            f"report.artefacts=[{head}]", "report.per_category=6", f"report.out={tmp_path / 'report'}",
            f"data.cache_dir={tmp_path / 'cache'}", "data.max_new_tokens=12", "data.top_k=8", "progress=false",
            "threads=1"])
    OmegaConf.update(cfg, "data.token_ids", _prompts(10, seed=9))
    md = run_report(cfg, target=Target(model))
    result = json.loads((md.parent / "acceptance.json").read_text())
    alpha = result["artefacts"][str(head)]["alpha"]["all"]
    assert result["settings"]["prompts"] == {"token_ids": 6} and len(alpha) == 3
    assert alpha[0][1] > 0 and all(0 <= a <= r for a, r in alpha) and alpha[1][1] == alpha[0][0]
    assert "| pos 1 | pos 2 | pos 3 |" in md.read_text() and (md.parent / "acceptance.png").stat().st_size > 0


def test_the_report_stops_on_data_budget_s_and_a_rerun_writes_the_uninterrupted_report(tmp_path, monkeypatch):
    """The report's long part is the target's held-out continuations (its own store):
    ``data.budget_s`` stops it after a shard, before anything is measured or written; the
    rerun goes on from the store and writes the report an uninterrupted run writes."""
    model = teacher()
    head = train_eagle(train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.steps=10",
                                 "data.forced_prompts=0"), target=Target(model))
    monkeypatch.setattr(TeacherSet, "shard_prompts", 2)

    def report(where, *overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train_report", overrides=[
                f"report.artefacts=[{head}]", "report.per_category=6", f"report.out={tmp_path / where}",
                f"data.cache_dir={tmp_path / where / 'cache'}", "data.max_new_tokens=12", "data.top_k=8",
                "data.batch_size=2", "progress=false", "threads=1", *overrides])
        OmegaConf.update(cfg, "data.token_ids", _prompts(10, seed=9))
        return run_report(cfg, target=Target(model))

    whole = json.loads((report("whole").parent / "acceptance.json").read_text())
    with pytest.raises(BudgetSpent, match="teacher data of 2 of 6 prompts done in .*rerun the same command"):
        report("stretches", "data.budget_s=1e-9")
    assert not list((tmp_path / "stretches").glob("acceptance.*"))  # nothing measured on part of the prompts
    with pytest.raises(BudgetSpent, match="teacher data of 4 of 6 prompts"):
        report("stretches", "data.budget_s=1e-9")
    assert json.loads((report("stretches", "data.budget_s=1e-9").parent / "acceptance.json").read_text()) == whole
    with pytest.raises(ConfigError, match=r"data.budget_s=-1; use 0 \(no budget\)"):
        report("refused", "data.budget_s=-1")


def test_translation_sentences_come_from_the_prose_and_only_german_answers_pass(tmp_path):
    article = ("Summarize this article.\n\nArticle: The council met on Monday to discuss the new budget plan for "
               "schools. It was short. Officials said the plan would take effect next year across the region.")
    records = [{"prompt": article, "source": "t0-cnn_dailymail"},
               {"prompt": "A sentence from another source that is long enough to count.", "source": "gsm8k-train"}]
    assert sorted(english_sentences(records, ["t0-cnn"], seed=0)) == [
        "Officials said the plan would take effect next year across the region.",
        "The council met on Monday to discuss the new budget plan for schools."]
    assert looks_german("Der Rat hat am Montag über den neuen Haushalt für die Schulen beraten.")
    assert not looks_german("The council met on Monday to discuss the new budget for the schools.")
    assert not looks_german("die der die der die der die der die der")  # a loop, not a sentence
    # the mixture's translation category is off until its share is set (the prompts come from the command)
    assert "translation" not in categories(_data_cfg(tmp_path).data)
    assert "translation" in categories(_data_cfg(tmp_path, "data.mixture.translation.share=0.1").data)


def test_data_only_run_fills_the_store_and_its_states_and_trains_nothing(tmp_path):
    cfg = train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.steps=0", "data.forced_prompts=0")
    root = train_eagle(cfg, target=Target(teacher()))
    names = [p.name for p in root.iterdir()]
    assert "manifest.json" in names and any(n.endswith(".final.safetensors") for n in names)
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_store_states_are_mapped_from_disk_not_read_in(tmp_path, dtype):
    from safetensors.torch import load_file, save_file

    from spec_zoo.train.store import mapped

    def resident_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

    file = tmp_path / "shard.states.safetensors"
    first = torch.randn(3, 5).to(dtype)  # written before the states: their offset is not the data's start
    save_file({"a": first, "states": torch.randn(4096, 4096).to(dtype)}, str(file))  # 32-64 MB
    before = resident_mb()
    states = mapped(file, "states")
    assert resident_mb() - before < 8  # nothing read yet: pages come in as they are touched
    assert states.dtype == dtype and torch.equal(states, load_file(file)["states"])
    assert torch.equal(mapped(file, "a"), first)
    states[0, 0] = 7  # a private mapping: the store is never written
    assert load_file(file)["states"][0, 0] != 7


def test_max_seconds_cuts_the_steps_to_what_fits(tmp_path):
    cfg = train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.steps=100000", "train.max_seconds=1",
                    "train.eval_every=100000", "data.forced_prompts=0")
    record = json.loads((train_eagle(cfg, target=Target(teacher())) / "eagle.json").read_text())
    assert 25 <= record["steps"] < 100000  # timed over steps 5..25, then as many as fit in the budget


def test_device_is_checked_before_any_model_loads(tmp_path, monkeypatch):
    import spec_zoo.train.loop as loop

    monkeypatch.setattr(loop, "load_teacher_target", lambda cfg: pytest.fail("loaded a model"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device=cuda but CUDA is not available here; use device=cpu"):
        train_eagle(train_cfg("train_eagle", tmp_path, "device=cuda"))


def test_patience_stops_at_a_held_out_plateau(tmp_path):
    """With nothing to learn (lr 0) held-out alpha never betters its start: the loop stops after
    ``patience`` evaluations, not ``train.steps``."""
    cfg = train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.lr=0", "train.patience=3",
                    "train.eval_every=2", "data.forced_prompts=0")
    record = json.loads((train_eagle(cfg, target=Target(teacher())) / "eagle.json").read_text())
    assert record["steps"] == 6 and [h["step"] for h in record["history"]] == [2, 4, 6]
    assert record["heldout_after"]["alpha_greedy"] == record["heldout_before"]["alpha_greedy"]


def test_patience_keeps_the_best_evaluations_weights(tmp_path):
    """Whether or not the plateau is reached, the artefact is the best held-out evaluation's weights."""
    cfg = train_cfg("train_eagle", tmp_path, "head.vocab_size=48", "train.lr=5e-2", "train.patience=2",
                    "train.eval_every=4", "data.forced_prompts=0")
    record = json.loads((train_eagle(cfg, target=Target(teacher())) / "eagle.json").read_text())
    seen = [record["heldout_before"]["alpha_greedy"]] + [h["alpha_greedy"] for h in record["history"]]
    assert record["heldout_after"]["alpha_greedy"] == max(seen)


def test_max_seconds_is_a_hard_stop_when_the_estimate_missed(monkeypatch):
    """Steps 5..25 predict about 100 steps in the budget; an evaluation at step 30 then takes 8 s the
    estimate never saw, and the loop ends there, once the budget is spent, rather than running on."""
    from spec_zoo.train import loop

    clock = [0.0]
    monkeypatch.setattr(loop.time, "time", lambda: clock[0])
    budget = loop.StepBudget(100, 10.0, 0)
    cut = []
    for step in range(1, 101):
        clock[0] += 0.1 + (8.0 if step == 30 else 0.0)
        if budget.after_step(step):
            cut.append(step)
        if step >= budget.steps:
            break
    assert budget.steps == 30 and cut[-1] == 30  # 3 s of steps + 8 s of evaluation: spent at step 30, not 100


def _talk_cfg(tmp_path, *overrides):
    rows = [{"prompt": f"chat question number {i} about topic {i * 7}", "source": "chat-x"} for i in range(12)]
    rows += [{"prompt": f"doc {i} " + "word " * (5 + i), "source": "doc-y"} for i in range(12)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train_distill", overrides=[
            f"data.prompts={path}", "~data.mixture", "+data.mixture={talk: {share: 0.5, sources: [chat], "
            "follow_up: true}, doc: {share: 0.5, sources: [doc]}}", "data.follow_ups=[Say less., Say more.]",
            "data.max_prompt_tokens=400", "data.max_new_tokens=8", "data.batch_size=4", "data.top_k=8",
            f"data.cache_dir={tmp_path / 'cache'}", "progress=false", *overrides])


def test_conversations_train_on_both_answers_and_never_split_across_shards(tmp_path):
    """A follow_up category holds conversations: each first turn is followed by the same
    conversation one turn on, built from the target's own answer to it; both are rows of the
    store, in one shard, and read back as written."""
    from spec_zoo.train.data import second_turn_ids
    from spec_zoo.train.mixture import FollowUp
    from tests.test_workloads import ChatTokenizer

    tok = ChatTokenizer()
    target = Target(teacher(), tokenizer=tok)
    cfg = _talk_cfg(tmp_path)
    ts = TeacherSet(cfg, target, 12)
    firsts = [i for i, p in enumerate(ts.prompts) if isinstance(p, FollowUp)]
    assert firsts and all(ts.categories[i] == ts.categories[i - 1] == 0 for i in firsts)
    assert ts.taken == {"talk": 6, "doc": 6} and [ts.prompts[i].question for i in firsts[:2]] == ["Say less.",
                                                                                                 "Say more."]
    data = ts.store.fill(target.model, ts.prompts, ts.categories, batch_size=2, eos_ids=[1], pad_id=0, seed=0,
                         shard_prompts=3, tokenizer=tok, progress=False)
    bounds = [tuple(map(int, p.name.split(".")[0].split("-")[1:])) for p in ts.store.root.glob("shard-*")]
    assert sorted(bounds) == [(0, 3), (3, 6), (6, 10), (10, 12)]  # 6-9 would split a conversation
    assert all(not isinstance(ts.prompts[a], FollowUp) for a, _ in bounds)
    for i in firsts:
        p, n = int(data.prompt_len[i - 1]), int(data.gen_len[i - 1])
        first, answer = ts.prompts[i].first, data.ids[i - 1, p : p + n].tolist()
        assert data.ids[i - 1, :p].tolist() == tok.apply_chat_template([{"role": "user", "content": first}])
        assert data.ids[i, : int(data.prompt_len[i])].tolist() == second_turn_ids(tok, first, answer,
                                                                                  ts.prompts[i].question)
        assert int(data.gen_len[i]) > 0  # the second answer is teacher data too
    again = TeacherSet(_talk_cfg(tmp_path), target, 12).fill(12, progress=False)
    assert torch.equal(again.ids, data.ids) and torch.equal(again.topk_ids, data.topk_ids)
    # a run of 9 would cut the third conversation between its turns: it stops at 8, and a longer run
    # of another store then starts its next shard at a first turn
    short = TeacherSet(_talk_cfg(tmp_path, f"data.store={tmp_path / 'short'}"), target, 9)
    assert len(short.prompts) == 8 and not isinstance(short.prompts[-1], FollowUp) and len(short.fill(5)) == 4
    longer = TeacherSet(_talk_cfg(tmp_path, f"data.store={tmp_path / 'short'}"), target, 12).fill(12)
    assert torch.equal(longer.ids[:, : data.ids.shape[1]], data.ids)


def test_conversations_are_refused_without_their_questions_or_with_a_benchmark_turn(tmp_path):
    from tests.test_workloads import ChatTokenizer, _bench_turn

    target = Target(teacher(), tokenizer=ChatTokenizer())
    with pytest.raises(ConfigError, match="data.mixture.talk.follow_up=true needs data.chat=true and data.follow_ups"):
        categories(_talk_cfg(tmp_path, "data.follow_ups=[]").data)
    with pytest.raises(ConfigError, match="follow_up=true needs data.chat=true"):
        categories(_talk_cfg(tmp_path, "data.chat=false").data)
    with pytest.raises(ConfigError, match="data.follow_ups: .* shares 8 words with a Spec-Bench question"):
        TeacherSet(_talk_cfg(tmp_path, f"data.follow_ups=[{json.dumps(_bench_turn())}]"), target, 12)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):  # the shipped questions: the report's differ
        train, report = compose("train_distill"), compose("train_report")
    assert train.data.follow_ups and not set(train.data.follow_ups) & set(report.report.follow_ups)


def test_a_category_draws_from_its_own_file_or_a_packaged_one(tmp_path):
    """``data.mixture.<c>.file``: a category's prompts from another JSONL (a bare name finds the
    files packaged with spec-zoo, e.g. the human German); it is part of the store's identity."""
    from spec_zoo.train.data import CHECKOUT_DATA, prompts_path, read_records
    from spec_zoo.train.mixture import describe

    own = tmp_path / "own.jsonl"
    own.write_text("\n".join(json.dumps({"prompt": f"own text {i}", "source": "own-z"}) for i in range(6)))
    cfg = _talk_cfg(tmp_path, "~data.mixture", f"+data.mixture={{doc: {{share: 0.5, sources: [doc]}}, "
                    f"mine: {{share: 0.5, sources: [own], file: {own}}}}}", "data.chat=false")
    cats = categories(cfg.data)
    prompts, cat_of, taken = mixture_prompts(_Tokenizer(), cfg.data, cats, 8)
    assert taken == {"doc": 4, "mine": 4}
    mine = {tuple(_Tokenizer()(f"own text {i}")["input_ids"]) for i in range(6)}
    assert {tuple(p) for p, c in zip(prompts, cat_of) if c == 1} <= mine
    assert describe(cfg.data, cats)["categories"][1][-1].startswith("file ")  # another file: another store
    assert prompts_path("human_german.jsonl") == CHECKOUT_DATA / "human_german.jsonl.gz"  # stored gzipped
    german = read_records("human_german.jsonl")
    assert {r["source"] for r in german} == {"wmt-newstest2013-de", "wmt-newstest2012-de"}
    assert all(r["prompt"].startswith("Translate German to English: ") for r in german)
    news = read_records("news_articles.jsonl")
    assert {r["source"] for r in news} == {"cnndm-val"} and all(r["prompt"].startswith("Summarize: ") for r in news)
    with pytest.raises(ConfigError, match="data.mixture.mine.file: nothere.jsonl does not exist.*human_german.jsonl"):
        mixture_prompts(_Tokenizer(), cfg.data, {**cats, "mine": {**cats["mine"], "file": "nothere.jsonl"}}, 8)


def test_text_not_licensed_for_redistribution_is_read_from_a_checkout_and_named_when_missing(monkeypatch, tmp_path):
    """The WMT and CNN/DM text lies in data/ of the repository, outside every package: an
    installed wheel has no copy, and naming one says where it lies."""
    import spec_zoo.train.data as data

    assert Path(__file__).resolve().parents[1] / "data" == data.CHECKOUT_DATA
    for name in data.CHECKOUT_ONLY:
        assert (data.CHECKOUT_DATA / f"{name}.gz").is_file() and not list(data.PACKAGED_PROMPTS.parent.glob(f"{name}*"))
    monkeypatch.setattr(data, "CHECKOUT_DATA", tmp_path / "site-packages-has-no-data")
    with pytest.raises(ConfigError, match=r"'news_articles.jsonl' is not installed with spec-zoo .*data/ of the "
                                          r"spec-zoo source repository"):
        data.read_records("news_articles.jsonl", key="report.workloads.summarization.file")
    assert data.read_records("nq_questions.jsonl")  # CC BY-SA 3.0: installed


def test_the_packaged_workload_files_never_share_eight_words_with_spec_bench():
    from spec_zoo.bench.dataset import DATASETS
    from spec_zoo.inputs import read_utf8
    from spec_zoo.train.data import read_records
    from spec_zoo.train.mixture import word_ngrams
    from spec_zoo.train.workloads import bench_ngrams

    grams = bench_ngrams(None, 8)
    def words(text: str) -> str:
        return " ".join(re.findall(r"[a-z0-9]+", text.lower()))

    turns = {words(t) for line in read_utf8(DATASETS["spec_bench"], "spec_bench").splitlines()
             for t in json.loads(line)["turns"]}  # short questions have no 8-word run: compare them whole
    for name in ("human_german.jsonl", "news_articles.jsonl", "nq_questions.jsonl"):
        records = read_records(name)
        assert len(records) >= 300 and not [r for r in records if word_ngrams(r["prompt"], 8) & grams], name
        assert not [r for r in records if words(r["prompt"]) in turns], name


def test_held_out_mixture_prompts_are_never_a_document_trained_on_in_another_template(tmp_path):
    """``heldout_ngram``: a held-out prompt sharing that many + 7 words with a trained text is
    skipped (T0 asks of one article in several templates); with 0, exact texts only."""
    import random

    rng = random.Random(1)
    docs = [" ".join(f"w{rng.randrange(400)}" for _ in range(40)) for _ in range(6)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"Summarize: {t}", "source": "doc-a"}) for t in docs))
    cfg = OmegaConf.create({"data": {"prompts": str(path), "use_mixture": True, "sources": None, "chat": False,
                                     "max_prompt_tokens": 4000, "seed": 0,
                                     "mixture": {"doc": {"share": 1.0, "sources": ["doc"]}}}})
    cats = categories(cfg.data)
    trained = frozenset({f"TL;DR: {docs[2]}"})  # the same article, asked in another template
    exact = mixture_prompts(_Tokenizer(), cfg.data, cats, 6, heldout=trained)[0]
    apart = mixture_prompts(_Tokenizer(), cfg.data, cats, 6, heldout=trained, heldout_ngram=20)[0]
    article = tuple(_Tokenizer()(f"Summarize: {docs[2]}")["input_ids"])
    assert len(exact) == 6 and article in {tuple(p) for p in exact}
    assert len(apart) == 5 and article not in {tuple(p) for p in apart}


def test_length_groups_deal_batches_of_like_lengths_and_resume_the_same():
    """``train.length_groups``: a block of G batches holds G * size distinct rows, each batch of
    like lengths (less padding than a random draw); a step's rows depend on the step alone, so a
    resumed run trains on what an uninterrupted one did; too few rows fall back to random draws."""
    from spec_zoo.train.loop import batch_rows

    lengths = torch.randint(20, 700, (1000,), generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(0)
    block = [batch_rows(step, lengths, 32, 16, gen, seed=0) for step in range(16)]
    rows = torch.cat(block)
    assert len(rows) == len(set(rows.tolist())) == 512
    padded = sum(int(lengths[b].max()) * len(b) for b in block)
    random = sum(int(lengths[torch.randint(0, 1000, (32,), generator=gen)].max()) * 32 for _ in range(16))
    assert padded < 0.6 * random
    assert torch.equal(batch_rows(21, lengths, 32, 16, torch.Generator(), seed=0),
                       batch_rows(21, lengths, 32, 16, torch.Generator().manual_seed(5), seed=0))
    assert not torch.equal(batch_rows(21, lengths, 32, 16, gen, seed=0), batch_rows(21, lengths, 32, 16, gen, seed=1))
    assert len(batch_rows(0, lengths[:40], 32, 16, gen, seed=0)) == 32  # one batch's worth: random draws


def test_keep_states_writes_more_states_from_the_same_forward(tmp_path):
    """``data.keep_states``: a head's states pass also writes the states other recipes read
    (final, layer<E>, layers<a>_<b>), one forward per batch; a later pass for one of them reads
    the file and computes nothing, and each equals the target's own states."""
    from spec_zoo.train.store import named_states, state_layers

    model = teacher()
    ts = TeacherSet(_data_cfg(tmp_path), Target(model), 12)
    data = ts.fill(12, progress=False)
    names = ("layers0_1", "final", "layer1")
    calls = []

    def every(ids):
        calls.append(len(ids))
        return named_states(model.model, ids, names)

    never = lambda ids: pytest.fail("computed what the store holds")  # noqa: E731
    fused = ts.store.states("layers0_1", every, 4, progress=False, keep=names[1:])
    shards = sorted(p.name for p in ts.store.root.glob("shard-*[0-9].safetensors") if p.name.count(".") == 1)
    assert calls and all((ts.store.root / f"{s[: -len('.safetensors')]}.{n}.safetensors").is_file()
                         for s in shards for n in names)
    final, layer1 = ts.store.states("final", never, 4, progress=False), ts.store.states("layer1", never, 4)
    for i in (0, 7):
        n = int(data.prompt_len[i] + data.gen_len[i])
        out = model.model(input_ids=data.ids[i : i + 1, :n], output_hidden_states=True)
        assert torch.allclose(final[i], out.last_hidden_state[0], atol=1e-5)
        assert torch.allclose(layer1[i], out.hidden_states[1][0], atol=1e-5)
        assert torch.allclose(fused[i], torch.cat([out.hidden_states[0][0], out.hidden_states[1][0]], -1), atol=1e-5)
    assert state_layers("layers2_15_27") == (2, 15, 27) and state_layers("final") is None
    for bad, words in (("layer", "names no target states"), ("layers3", "names no target states"),
                       ("layer9", "a layer the target lacks")):
        with pytest.raises(ConfigError, match=words):
            state_layers(bad, num_layers=2)


def test_a_recipe_writes_data_keep_states_beside_its_own(tmp_path):
    from spec_zoo.drafters.eagle.train import Eagle3Recipe
    from spec_zoo.train.loop import train_module

    model = teacher()
    cfg = train_cfg("train_eagle3", tmp_path, "data.keep_states=[final,layer1]", "train.steps=2")
    train_module(cfg, Eagle3Recipe.from_config(cfg), Target(model))
    written = {p.name.split(".")[1] for p in Path(cfg.data.store).glob("shard-*.*.safetensors")}
    assert {"final", "layer1"} < written and any(n.startswith("layers") for n in written)
    for bad, words in (("[nope]", "names no target states"), ("[layer99]", "a layer the target lacks")):
        cfg = train_cfg("train_eagle3", tmp_path / bad[1:-1], f"data.keep_states={bad}", "train.steps=2")
        with pytest.raises(ConfigError, match=words):
            train_module(cfg, Eagle3Recipe.from_config(cfg), Target(model))
