"""``drafter=auto`` (spec_zoo/auto.py): it picks what its pricing says is best, caches the choice
and reuses it, recovers from a broken cache, decodes exactly as the chosen drafter named
directly, and refuses bad settings before any calibration. On a tiny model with a planted
cost table, so nothing is timed that matters."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import spec_zoo.auto as auto
from spec_zoo.api import build_decoder, compose_config, run
from spec_zoo.auto import Calibration, choice_path, ranked
from spec_zoo.costs import CostTable, table_path
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.testing import repetitive_prompt
from tests.tiny import one_thread, tiny_llama  # noqa: F401  (one_thread: an autouse fixture)

FLAT = CostTable([1e-3] * 16, "tiny", "eager", "float64", 1, "test")  # scoring 16 tokens costs what 1 does


def calibration(tokens: int, steps: int = 10, scored: int = 5, draft_s: float = 0.0) -> Calibration:
    return Calibration(steps, tokens, [scored] * steps, draft_s, 100)


def test_the_candidate_with_the_best_acceptance_wins():
    rows = ranked({"ngram": calibration(15), "suffix": calibration(30), "eagle": calibration(20)}, FLAT, 1e-3)
    assert [r[0] for r in rows] == ["suffix", "eagle", "ngram", "none"]
    assert rows[0][1] == pytest.approx(3.0)  # 30 tokens in 10 steps that each cost one plain step


def test_dear_drafting_chooses_plain_decoding():
    """The same acceptance, but drafting costs two plain steps per step: no drafter pays."""
    rows = ranked({"ngram": calibration(30, draft_s=10 * 2e-3)}, FLAT, 1e-3)
    assert rows[0][0] == "none" and rows[1][1] == pytest.approx(1.0)  # a tie goes to plain decoding


def test_dear_scoring_is_priced_from_the_table():
    """t(M) grows with M: a candidate scoring many nodes pays for them."""
    steep = CostTable([1e-3 * m for m in range(1, 17)], "tiny", "eager", "float64", 1, "test")
    rows = ranked({"wide": calibration(40, scored=9), "narrow": calibration(30, scored=2)}, steep, 1e-3)
    assert [r[0] for r in rows] == ["narrow", "none", "wide"]
    assert rows[0][1] == pytest.approx(1.5) and rows[2][1] == pytest.approx(40 / 90)  # 10 steps x t(M)/t(1)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A tiny target with a planted cost table in a fresh cache, and a counter of calibrations."""
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path))
    target = Target(tiny_llama(sharpness=3.0))
    FLAT.save(table_path(target))
    calls = []
    real = auto.calibrate

    def counted(decoder, prompts, tokens):
        calls.append(decoder.drafter.name)
        return real(decoder, prompts, tokens)

    monkeypatch.setattr(auto, "calibrate", counted)
    return target, calls


def config(*overrides: str, prompt=None):
    cfg = compose_config(["drafter=auto", "drafter.candidates=[ngram,suffix,eagle]", "drafter.tokens=12",
                          "generation.max_new_tokens=16", "compare=false", *overrides])
    OmegaConf.update(cfg, "prompt", prompt or repetitive_prompt(3))
    return cfg


def test_choice_is_cached_and_recalibrate_measures_again(setup, capsys):
    target, calls = setup
    cfg = config()
    build_decoder(cfg, target=target)
    first = capsys.readouterr().err
    assert calls == ["ngram", "suffix"], "eagle has no head for this target: skipped, not calibrated"
    assert first.count("\n") == 1 and "drafter=auto chose" in first and "skipped eagle" in first
    record = json.loads(choice_path(target).read_text())
    assert record["choice"] in ("ngram", "suffix", "none") and list(record["skipped"]) == ["eagle"]
    build_decoder(config(), target=target)
    assert calls == ["ngram", "suffix"], "the cached choice is reused without calibrating"
    assert "cached in" in capsys.readouterr().err
    build_decoder(config("drafter.recalibrate=true"), target=target)
    assert calls == ["ngram", "suffix"] * 2


def test_other_candidates_calibrate_again(setup):
    target, calls = setup
    build_decoder(config(), target=target)
    build_decoder(config("drafter.candidates=[ngram]"), target=target)
    assert calls == ["ngram", "suffix", "ngram"]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": "spec-zoo-auto-choice", "choice": 3}'])
def test_a_corrupt_cache_is_warned_about_and_replaced(setup, capsys, content):
    target, calls = setup
    path = choice_path(target)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    build_decoder(config(), target=target)
    err = capsys.readouterr().err
    assert "warning: drafter=auto: the cached choice" in err and "calibrating again" in err
    assert calls == ["ngram", "suffix"]
    assert json.loads(path.read_text())["format"] == auto.FORMAT


def test_auto_decodes_exactly_as_the_chosen_drafter(setup):
    target, _ = setup
    cfg = config()
    decoder = build_decoder(cfg, target=target)
    chosen = json.loads(choice_path(target).read_text())["choice"]
    assert decoder.drafter.name == chosen and cfg.drafter == compose_config([f"drafter={chosen}"]).drafter
    direct = compose_config([f"drafter={chosen}", "generation.max_new_tokens=16"])
    OmegaConf.update(direct, "prompt", repetitive_prompt(3))
    assert run(cfg, decoder).ids == run(direct, build_decoder(direct, target=target)).ids


def test_planted_acceptance_decides_the_choice(setup, monkeypatch):
    """End to end: the candidate whose calibration is planted to accept most is the one built."""
    target, _ = setup
    planted = {"ngram": calibration(12), "suffix": calibration(40)}
    monkeypatch.setattr(auto, "calibrate", lambda decoder, prompts, tokens: planted[decoder.drafter.name])
    assert build_decoder(config(), target=target).drafter.name == "suffix"
    planted["suffix"] = calibration(40, draft_s=1.0)  # drafting dearer than its gain
    assert build_decoder(config("drafter.recalibrate=true"), target=target).drafter.name == "ngram"


def test_params_reach_every_candidate_and_the_choice(setup, monkeypatch):
    """``drafter.params`` (a head trained for this target, say) builds the candidate it names, in
    calibration and as the choice; other params are another choice to calibrate, not a cache hit."""
    target, _ = setup
    planted, seen = {"ngram": calibration(40), "suffix": calibration(12)}, []

    def calibrate(decoder, prompts, tokens):
        seen.append((decoder.drafter.name, getattr(decoder.drafter, "max_ngram", None)))
        return planted[decoder.drafter.name]

    monkeypatch.setattr(auto, "calibrate", calibrate)
    cfg = config("drafter.candidates=[ngram,suffix]", "+drafter.params.ngram.max_ngram=2")
    decoder = build_decoder(cfg, target=target)
    assert decoder.drafter.name == "ngram" and decoder.drafter.max_ngram == 2 == cfg.drafter.max_ngram
    assert json.loads(choice_path(target).read_text())["params"] == {"ngram": {"max_ngram": 2}}
    assert build_decoder(config("drafter.candidates=[ngram,suffix]", "+drafter.params.ngram.max_ngram=2"),
                         target=target).drafter.max_ngram == 2  # the cached choice, with its params
    build_decoder(config("drafter.candidates=[ngram,suffix]", "+drafter.params.ngram.max_ngram=3"), target=target)
    assert [m for name, m in seen if name == "ngram"] == [2, 3]
    settings = auto.AutoChoice(candidates=["ngram", "suffix"], params={"ngram": {"max_ngram": 2}})
    assert settings.option("ngram").max_ngram == 2 and "max_ngram" not in settings.option("suffix")  # the bench's too
    nested = auto.AutoChoice(candidates=["cascade"], params={"cascade": {"params": {"ngram": {"max_ngram": 2}}}})
    assert nested.option("cascade").params.ngram.max_ngram == 2  # a key the option leaves empty


def test_a_missing_cost_table_is_timed_briefly_for_what_was_scored(setup, monkeypatch):
    """Without a stored table auto times only the M its calibrations scored, at one context, and
    stores nothing (a full table takes many minutes: `spec-zoo costs`)."""
    target, _ = setup
    table_path(target).unlink()
    measured = []

    def fake_measure(target, max_tokens=32, repeats=9, contexts=(100,), progress=True):
        measured.append((max_tokens, list(contexts), repeats))
        return FLAT

    monkeypatch.setattr(auto, "measure", fake_measure)
    decoder = build_decoder(config(), target=target)
    (max_tokens, contexts, repeats), = measured
    assert 1 < max_tokens <= auto.QUICK_MAX_TOKENS and len(contexts) == 1 and repeats < 9
    assert not table_path(target).is_file()
    assert decoder.drafter.name in ("ngram", "suffix", "eagle", "none")


@pytest.mark.parametrize(("override", "says"), [
    ("drafter.candidates=[ngram,nosuch]", "'nosuch' is not a drafter option"),
    ("drafter.candidates=[]", "is empty"),
    ("drafter.candidates=[ngram,medusa_typical]", "'medusa_typical' is a lossy method"),
    ("drafter.candidates=[auto]", "'auto' is not a drafter option"),
    ("verifier=typical", "verifier=typical is lossy"),
    ("drafter.tokens=1", "drafter.tokens"),
    ("drafter.workload=nosuch", "drafter.workload"),
    ("+drafter.params.medusa.heads=2", "'medusa', which is not a candidate"),
])
def test_bad_settings_are_refused_before_any_calibration(setup, override, says):
    target, calls = setup
    with pytest.raises(ConfigError, match="drafter") as err:
        build_decoder(config(override), target=target)
    assert says in str(err.value) and calls == []
    assert not choice_path(target).exists()


def test_a_named_workload_gives_the_calibration_prompts():
    settings = auto.AutoChoice(candidates=["ngram"], prompts=2, workload="repetitive")
    prompts = settings.calibration_prompts(["ignored"])
    assert len(prompts) == 2 and all(isinstance(p, str) and p != "ignored" for p in prompts)
