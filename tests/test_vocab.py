"""The draft vocabulary as a knob (issue 24): the K most frequent tokens of the teacher data
(FR-Spec style) give a draft that stays exact though it cannot draft the other tokens, and
`spec-zoo-train vocab` measures each size's coverage of a benchmark's tokens and its cost."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.eagle.head import EagleHead
from spec_zoo.errors import ConfigError
from spec_zoo.registry import CONF_DIR
from spec_zoo.runtime.target import Target
from spec_zoo.testing import (
    assert_greedy_identity,
    assert_lossless,
    certify_model,
    hf_greedy,
    repetitive_prompt,
    tiny_llama,
)
from spec_zoo.train.batches import select_vocab
from spec_zoo.train.store import TeacherSet
from spec_zoo.train.vocab import artefact_vocab, run_vocab
from tests.heads import teacher
from tests.test_distill import _prompts
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)


def _knob(model, size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the model's own greedy text (its teacher data)."""
    text = hf_greedy(model, repetitive_prompt(7, model.config.vocab_size), 40)
    return select_vocab(torch.bincount(torch.tensor(text), minlength=model.config.vocab_size).float(), size)


def test_a_frequency_chosen_draft_vocabulary_never_drafts_other_tokens_and_stays_exact():
    drafted: list[int] = []

    def factory(model):
        vocab = _knob(model, 16)
        drafter = EagleDrafter(EagleHead(model, 1, vocab_ids=vocab).eval(), num_draft=3, adaptive=False)
        propose = drafter.propose

        def watch(state):
            draft = propose(state)
            drafted.extend(int(t) for t in draft.tokens)
            assert all(int(t) in set(vocab.tolist()) for t in draft.tokens), "drafted outside the draft vocabulary"
            return draft
        drafter.propose = watch
        return drafter

    assert_greedy_identity(factory, seeds=(0,), max_new_tokens=30)
    model = tiny_llama(0, sharpness=3.0)  # the helper's seed-0 target: its text holds tokens the draft cannot draft
    assert drafted and set(hf_greedy(model, repetitive_prompt(0), 30)) - set(_knob(model, 16).tolist())
    # sampling at T = 1: the exact law (enumerated) with a 3-of-4-token knob vocabulary
    model = certify_model()
    three = _knob(model, 3)  # chosen once: certify builds a drafter per enumerated branch
    cert = assert_lossless(lambda m: EagleDrafter(EagleHead(m, 1, vocab_ids=three).eval(), num_draft=2,
                                                  adaptive=False, sample=True), model=model)
    assert cert.tau > 1


def _store(tmp_path):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train_vocab", overrides=[
            "data.max_new_tokens=10", "data.batch_size=4", "data.top_k=4", f"data.cache_dir={tmp_path / 'c'}",
            "progress=false", "threads=1", "vocab.sizes=[8,32,0]", "vocab.repeats=1", "vocab.context=16",
            f"vocab.out={tmp_path / 'out'}", f"vocab.bench_results={tmp_path / 'results.jsonl'}"])
    OmegaConf.update(cfg, "data.token_ids", _prompts(12))
    model = teacher()
    data = TeacherSet(cfg, Target(model), 12).fill(12, progress=False)
    return cfg, model, data


def test_vocab_tool_measures_coverage_per_size_and_cost(tmp_path):
    cfg, model, data = _store(tmp_path)
    answers = data.token_counts(64)
    top8 = select_vocab(answers, 8, [])
    inside, outside = int(top8[0]), next(t for t in range(64) if t not in set(top8.tolist()))
    rows = [{"method": "ar", "question_id": 1, "turn": 1, "repeat": r, "category": "qa",
             "output_ids": [inside, inside, inside, outside]} for r in range(2)]  # the repeat counts once
    rows += [{"method": "ar", "question_id": 2, "turn": 1, "repeat": 0, "category": "rag", "output_ids": [outside]},
             {"method": "other", "question_id": 2, "turn": 1, "repeat": 0, "category": "rag", "output_ids": [inside]}]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    md = run_vocab(cfg, target=Target(model))
    got = json.loads((md.parent / "vocab.json").read_text())
    cov = got["coverage"]
    assert cov["8 (answers)"] == {"qa": 0.75, "rag": 0.0, "all": 0.6}
    assert cov["full (answers)"] == {"qa": 1.0, "rag": 1.0, "all": 1.0}
    assert got["settings"]["store_tokens"] == {"answers": int(answers.sum()),
                                               "answers+prompts": int((data.ids >= 0).sum())}
    assert set(got["cost_s"]) == {"8", "32", "full", "target"} and all(v > 0 for v in got["cost_s"].values())
    assert "| full (answers) | 1.000 | 1.000 | 1.000 |" in md.read_text()
    cfg.vocab.bench_method = "nope"
    with pytest.raises(ConfigError, match="vocab.bench_method='nope' has no records"):
        run_vocab(cfg, target=Target(model))
    cfg.vocab.bench_method, cfg.vocab.store = "ar", str(tmp_path / "empty")
    with pytest.raises(ConfigError, match="holds no teacher-data shards"):
        run_vocab(cfg, target=Target(model))


def test_an_artefact_keeps_its_draft_vocabulary(tmp_path):
    from spec_zoo.artefacts import describe_target
    from spec_zoo.draft_head import save_head

    model = teacher()
    vocab = torch.tensor([2, 5, 9, 33])
    save_head(EagleHead(model, 0, vocab_ids=vocab), tmp_path / "h", describe_target(model, "tiny"), {})
    assert artefact_vocab(tmp_path / "h").tolist() == vocab.tolist()
    save_head(EagleHead(model, 0), tmp_path / "full", describe_target(model, "tiny"), {})
    assert artefact_vocab(tmp_path / "full") is None

    from spec_zoo.drafters.eagle.formats import Eagle3Head, save_eagle3

    for layout in ("speculators", "eagle3"):  # an EAGLE-3 head's draft vocabulary is its t2d, in either layout
        head = Eagle3Head.from_target(model.float(), (0, 1, 1), 1, vocab)
        save_eagle3(head, tmp_path / layout, layout, dtype=torch.float32)
        assert artefact_vocab(tmp_path / layout).tolist() == vocab.tolist()
    save_eagle3(Eagle3Head.from_target(model.float(), (0, 1, 1), 1), tmp_path / "e3full", "speculators",
                dtype=torch.float32)
    assert artefact_vocab(tmp_path / "e3full") is None


def _row_of(ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.tensor([ids.tolist().index(t) for t in keep.tolist()])


def test_a_trimmed_head_keeps_its_own_rows_of_its_most_frequent_tokens(tmp_path):
    from spec_zoo.artefacts import describe_target
    from spec_zoo.draft_head import load_head, save_head
    from spec_zoo.drafters.eagle.formats import Eagle3Head, load_published, save_eagle3
    from spec_zoo.train.trim import trim_head

    model = teacher().float()
    counts = torch.arange(64, dtype=torch.float).flip(0)  # token t seen 64 - t times: low ids most frequent
    vocab = torch.tensor([2, 5, 9, 20, 33, 40, 50, 63])
    # a spec-zoo EAGLE head with trained rows, and an EAGLE-3 head in both layouts
    eagle = EagleHead(model, 0, vocab_ids=vocab, train_head=True)
    with torch.no_grad():
        eagle.head.add_(torch.randn_like(eagle.head))  # its own rows, not the target's
    save_head(eagle, tmp_path / "eagle", describe_target(model, "tiny"), {"steps": 7})
    out = trim_head(tmp_path / "eagle", model, counts, 3, tmp_path / "eagle3tok", always=[63])
    small = load_head(EagleHead, out, model, "k", "c")
    assert small.vocab_ids.tolist() == [2, 5, 63]  # the two most frequent of its own, and the one always kept
    full = load_head(EagleHead, tmp_path / "eagle", model, "k", "c")
    assert torch.equal(small.head, full.head[_row_of(vocab, small.vocab_ids)])
    assert small.record["trimmed_from"]["draft_vocab_size"] == 8 and small.record["steps"] == 7
    for layout in ("speculators", "eagle3"):
        head = Eagle3Head.from_target(model, (0, 1, 1), 1, vocab)
        with torch.no_grad():
            head.lm_head.weight.add_(torch.randn_like(head.lm_head.weight))
        save_eagle3(head, tmp_path / layout, layout, dtype=torch.float32)
        (tmp_path / layout / "eagle3_training.json").write_text(json.dumps({"steps": 9}))
        out = trim_head(tmp_path / layout, model, counts, 4, tmp_path / f"{layout}4")
        record = json.loads((out / "eagle3_training.json").read_text())  # the report reads it as the original
        assert record["steps"] == 9 and record["trimmed_from"]["draft_vocab_size"] == 8
        trimmed = load_published(out, model, "auto")
        assert isinstance(trimmed, Eagle3Head) and trimmed.vocab_ids.tolist() == [2, 5, 9, 20]
        assert artefact_vocab(out).tolist() == [2, 5, 9, 20]
        whole = load_published(tmp_path / layout, model, "auto")
        stored = whole.lm_head.weight[:4].half().float()  # its own rows (written in the storage dtype)
        assert torch.equal(trimmed.lm_head.weight, stored)
        assert torch.equal(trimmed.fc.weight, whole.fc.weight.half().float())
    with pytest.raises(ConfigError, match="keeps them all"):
        trim_head(tmp_path / "speculators", model, counts, 8, tmp_path / "same")
    save_head(EagleHead(model, 0), tmp_path / "plain", describe_target(model, "tiny"), {})  # full vocabulary
    assert trim_head(tmp_path / "plain", model, counts, 5, tmp_path / "plain5") and \
        artefact_vocab(tmp_path / "plain5").tolist() == [0, 1, 2, 3, 4]


def test_a_trimmed_head_drafts_losslessly():
    def factory(m):
        from spec_zoo.train.trim import kept_tokens

        head = EagleHead(m, 1, vocab_ids=_knob(m, 24))
        keep = kept_tokens(head.vocab_ids, torch.ones(m.config.vocab_size), 6)
        trimmed = EagleHead(m, 1, vocab_ids=keep)
        trimmed.load_state_dict({**head.state_dict(), "vocab_ids": keep})
        return EagleDrafter(trimmed.eval(), num_draft=3, adaptive=False)

    assert_greedy_identity(factory, seeds=(0, 1), max_new_tokens=24)


def test_vocab_tool_trims_a_head_and_tables_its_coverage(tmp_path):
    from spec_zoo.artefacts import describe_target
    from spec_zoo.draft_head import save_head

    cfg, model, data = _store(tmp_path)
    rows = [{"method": "ar", "question_id": 1, "turn": 1, "repeat": 0, "category": "qa",
             "output_ids": data.ids[0][data.ids[0] >= 0].tolist()}]
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[0]))
    save_head(EagleHead(model, 0, vocab_ids=select_vocab(data.token_counts(64), 40, [])), tmp_path / "h40",
              describe_target(model, "tiny"), {})
    cfg.vocab.trim_head = str(tmp_path / "h40")
    md = run_vocab(cfg, target=Target(model))
    got = json.loads((md.parent / "vocab.json").read_text())["coverage"]
    assert artefact_vocab(md.parent / "trimmed" / "8").tolist() == select_vocab(data.token_counts(64), 8, []).tolist()
    assert not (md.parent / "trimmed" / "32").exists() or artefact_vocab(md.parent / "trimmed" / "32").numel() == 32
    assert got["8 (8)"] == got["8 (answers)"]  # the trimmed head covers what the 8 most frequent do
    cfg.vocab.out = str(tmp_path / "again")
    (tmp_path / "again" / "trimmed" / "8").mkdir(parents=True)
    with pytest.raises(ConfigError, match="trimmed/8 exists"):
        run_vocab(cfg, target=Target(model))
    cfg.vocab.trim_head = str(tmp_path)
    with pytest.raises(ConfigError):
        run_vocab(cfg, target=Target(model))
