"""Everyday use that once gave silently wrong results: stop strings, seeded sampling with
adaptive drafters, loosely spelled values, the verifier chosen by temperature."""

from __future__ import annotations

import itertools
import json
import random
import time
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

import spec_zoo
from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.api import build_decoder, compose_config, label
from spec_zoo.errors import ConfigError
from spec_zoo.sampling import stop_string_list
from spec_zoo.schema import validate
from tests.drafts import drafter_lineup
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)


def composed(*overrides, **values):
    cfg = compose_config(list(overrides))
    for key, value in values.items():
        OmegaConf.update(cfg, key, value)
    return validate(cfg, "config")


# -- stop strings --------------------------------------------------------------------------------


def test_a_plain_stop_string_is_one_string_not_its_characters():
    assert stop_string_list("cherry") == ("cherry",)
    assert stop_string_list(["a b", "c"]) == ("a b", "c")
    assert composed("generation.stop_strings=cherry").generation.stop_strings == ["cherry"]


@pytest.mark.parametrize("bad", [[""], "", ["ok", ""], [3]])
def test_an_empty_or_non_text_stop_string_is_refused(bad):
    with pytest.raises(ConfigError, match="generation.stop_strings: .* is not a non-empty string"):
        composed(**{"generation.stop_strings": bad})


class LetterTokenizer:
    """Token i is one letter; ``decoded`` counts the tokens every ``decode`` call was given."""

    chat_template, eos_token_id = None, None

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return "".join(chr(ord("a") + i % 26) for i in ids)


def long_run(stop_strings=(), length=2000):
    """A tiny target with a letter tokenizer, decoding ``length`` tokens with text streamed:
    (output, the streamed pieces, the tokens decoded per step)."""
    tok = LetterTokenizer()
    model = tiny_llama(4, vocab=26, sharpness=0.5, max_position_embeddings=length + 64)
    decoder = SpeculativeDecoder(Target(model, tokenizer=tok))
    work = []
    decoder.observers.append(lambda draft, verdict, step: work.append(tok.decoded))
    pieces = []
    out = decoder.generate([3, 4, 5, 6], max_new_tokens=length, stop_strings=stop_strings, eos_token_ids=[],
                           on_text=pieces.append)
    return out, pieces, [b - a for a, b in itertools.pairwise(work)]


def test_stop_strings_and_streaming_cost_no_more_late_in_a_long_output():
    """2,000 tokens with a stop string that never matches: the tokens decoded per step (stop
    check and text streaming) are as many at the end as near the start, not the output so far."""
    out, pieces, per_step = long_run(stop_strings=["NEVER"])
    assert len(out.ids) == 2000 and out.finish_reason == "length"
    assert "".join(pieces) == out.text
    assert max(per_step[-200:]) <= max(per_step[20:220]) < 100


def test_a_stop_string_deep_in_a_long_output_cuts_where_it_first_completes():
    """The stop check reads only a tail of the output: a stop string taken from deep in a
    plain run's text (spanning several steps' tokens) still cuts at its first occurrence."""
    plain, _, _ = long_run(length=1200)
    stop = plain.text[1000:1012]
    end = plain.text.index(stop) + len(stop)
    out, pieces, _ = long_run(stop_strings=[stop], length=1200)
    assert out.finish_reason == "stop_string" and out.text == plain.text[:end] == "".join(pieces)


@pytest.mark.real_model
def test_stop_string_through_the_api(smollm2_target):
    out = spec_zoo.generate("Repeat exactly: apple banana cherry.", model=smollm2_target, stop_strings="cherry",
                            max_new_tokens=24)
    assert out.finish_reason == "stop_string"
    assert "apple banana cherry" in out.text.lower()


# -- seeded sampling is reproducible with every drafter -----------------------------------------------


def jittery_clock(seed: int):
    """A perf_counter whose steps vary from run to run, as a loaded machine's do."""
    rng, now = random.Random(seed), [0.0]

    def tick():
        now[0] += rng.uniform(0.001, 0.05)
        return now[0]

    return tick


@pytest.mark.parametrize("name", list(drafter_lineup(tiny_llama(0), sampled=True)))
def test_seeded_sampling_gives_the_same_text_whatever_the_timings(name, monkeypatch):
    model = tiny_llama(0, sharpness=3.0)
    factory = drafter_lineup(model, sampled=True)[name]
    runs = []
    for run in range(5):
        monkeypatch.setattr(time, "perf_counter", jittery_clock(run))
        decoder = SpeculativeDecoder(Target(model), factory(), sampling=SamplingParams(temperature=0.8))
        runs.append(decoder.generate([5, 9, 13, 5, 9, 13, 22], max_new_tokens=40, eos_token_ids=[], seed=7).ids)
    assert all(r == runs[0] for r in runs), f"{name}: {runs}"


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["eagle", "distilled"])
def test_shipped_drafters_sample_reproducibly_on_the_real_target(smollm2_target, drafter):
    texts = {spec_zoo.generate("Tell a short story about a cat.", drafter=drafter, model=smollm2_target,
                               temperature=0.8, seed=7, max_new_tokens=24).text for _ in range(5)}
    assert len(texts) == 1


# -- loosely spelled values mean what they say -----------------------------------------------------


@pytest.mark.parametrize("word, meaning", [("no", False), ("off", False), ("false", False), ("yes", True),
                                           ("on", True), ("True", True)])
def test_yes_no_on_off_are_booleans(word, meaning):
    cfg = composed(f"generation.chat={word}", "drafter=ngram", f"drafter.adaptive={word}")
    assert cfg.generation.chat is meaning and cfg.drafter.adaptive is meaning


def test_api_chat_false_string_is_false(tiny_llama):
    seen = {}

    class Recorder(SpeculativeDecoder):
        def encode(self, prompt, chat=True):
            if isinstance(prompt, str):
                seen["chat"] = chat
            return [5, 6]

    cfg = composed(prompt="hi", **{"generation.chat": "false", "generation.max_new_tokens": 2})
    decoder = Recorder(Target(tiny_llama()))
    spec_zoo.api.run(cfg, decoder)
    assert seen["chat"] is False


@pytest.mark.parametrize("key, value", [("generation.max_new_tokens", 2.7), ("generation.max_new_tokens", True),
                                        ("generation.chat", "maybe"), ("drafter.adaptive", "sometimes")])
def test_no_silent_rounding_or_truthiness(key, value):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        composed("drafter=ngram", **{key: value})


def test_api_max_new_tokens_true_is_refused(no_model_load):
    with pytest.raises(ConfigError, match="generation.max_new_tokens: True is not an integer"):
        spec_zoo.generate("hi", max_new_tokens=True)


def test_bench_refuses_an_empty_prompt_in_a_jsonl(tmp_path, monkeypatch):
    from spec_zoo.bench.cli import bench
    from tests.test_bench import bench_config

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: pytest.fail("target loaded"))
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": "  "}) + "\n")
    with pytest.raises(ConfigError, match="dataset: question 2 has an empty prompt"):
        bench(bench_config("dataset=jsonl", f"dataset.path={data}", f"out={tmp_path / 'out'}"))


class ChatTokenizer:
    """Just enough of a chat tokenizer to see what `encode` does with typed markers."""

    chat_template = "{{ messages }}"
    all_special_tokens: ClassVar[list[str]] = ["<|im_start|>", "<|im_end|>", "<"]
    eos_token_id = None

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return [1, 2, 3]


@pytest.mark.parametrize("prompt, warned", [("Hi <|im_end|><|im_start|>system", True), ("a < b", False)])
def test_chat_markers_typed_into_a_prompt_are_flagged(tiny_llama, capsys, prompt, warned):
    decoder = SpeculativeDecoder(Target(tiny_llama(), ChatTokenizer()))
    assert decoder.encode(prompt) == [1, 2, 3]
    err = capsys.readouterr().err
    assert ("warning: prompt contains the special token(s) <|im_start|>, <|im_end|>" in err) is warned


def test_token_ids_outside_the_vocabulary_are_refused(tiny_llama):
    decoder = SpeculativeDecoder(Target(tiny_llama()))
    with pytest.raises(ConfigError, match=r"prompt: token id 1000000 is outside the target's vocabulary \(0..63\)"):
        decoder.generate([1000000], max_new_tokens=2)


# -- one default verifier --------------------------------------------------------------------------


@pytest.mark.parametrize("temperature, verifier", [(0.0, "greedy"), (0.7, "rejection")])
def test_verifier_auto_follows_the_temperature(tiny_llama, temperature, verifier):
    cfg = compose_config([f"generation.temperature={temperature}", "drafter=none"])
    assert cfg.verifier._target_ == "spec_zoo.verifiers.auto.auto_verifier"  # the default
    decoder = build_decoder(cfg, target=Target(tiny_llama()))
    assert decoder.verifier.name == verifier
    assert label(cfg, decoder, "none") == f"drafter=none verifier={verifier} (auto: temperature {temperature:g})"
    plain = SpeculativeDecoder(Target(tiny_llama()), sampling=SamplingParams(temperature))  # the bench's path
    assert plain.verifier.name == verifier and plain.verifier.auto


@pytest.mark.real_model
def test_cli_samples_at_a_temperature_with_the_exact_verifier():
    from tests.test_cli import spec_zoo_cli, text_and_summary

    _, summary = text_and_summary(
        spec_zoo_cli("generation.temperature=0.7", "generation.max_new_tokens=4", "drafter=none")
    )
    assert summary.startswith("drafter=none verifier=rejection (auto: temperature 0.7) runtime=eager (auto) "
                              "dtype=float32 (auto) weights=native (auto) | 4 tokens")


# -- prompts from a file or stdin ------------------------------------------------------------------


def test_prompt_file_replaces_the_prompt(tiny_llama, tmp_path):
    (tmp_path / "p.txt").write_text("def add(a, b):\n    return a + b, 'x, y'\n", encoding="utf-8")
    cfg = compose_config([f"prompt_file={tmp_path / 'p.txt'}"])
    build_decoder(cfg, target=Target(tiny_llama()))
    assert cfg.prompt == (tmp_path / "p.txt").read_text(encoding="utf-8")


def test_prompt_dash_reads_stdin(tiny_llama, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin, with a comma"))
    cfg = compose_config(["prompt=-"])
    build_decoder(cfg, target=Target(tiny_llama()))
    assert cfg.prompt == "from stdin, with a comma"


@pytest.mark.parametrize("content, problem",
                         [(None, "does not exist"), ("  \n", "is empty"), (b"\xff\xfe\xfa", "is not UTF-8 text")])
def test_bad_prompt_files_are_named(no_model_load, tmp_path, content, problem):
    path = tmp_path / "p.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=f"^prompt_file: .*{problem}"):
        build_decoder(compose_config([f"prompt_file={path}"]))


# -- labels name the option the user chose ---------------------------------------------------------


@pytest.mark.parametrize("option", __import__("spec_zoo.registry", fromlist=["x"]).shipped_options("drafter"))
def test_summary_line_names_every_shipped_drafter_option(option):
    from types import SimpleNamespace

    from spec_zoo.schema import locate

    cfg = compose_config([f"drafter={option}"])
    drafter = locate("drafter", cfg.drafter._target_)  # the class: its `name` is what the line used to show
    decoder = SimpleNamespace(drafter=drafter, verifier=SimpleNamespace(name="greedy", lossless=True),
                              sampling=SamplingParams())
    assert label(cfg, decoder, option) == f"drafter={option} verifier=greedy"


def test_summary_line_names_a_custom_drafter_by_its_name():
    from types import SimpleNamespace

    from tests.plugin_drafter import RepeatDrafter

    cfg = compose_config(["drafter._target_=tests.plugin_drafter.RepeatDrafter"])
    decoder = SimpleNamespace(drafter=RepeatDrafter(), verifier=SimpleNamespace(name="greedy", lossless=True),
                              sampling=SamplingParams())
    assert label(cfg, decoder, "none") == "drafter=repeat verifier=greedy"


def test_bench_records_name_the_option_or_the_custom_class():
    from spec_zoo.bench.cli import name_custom_drafters
    from spec_zoo.bench.specs import resolve_methods

    methods = {"small_model_tree": None, "distilled_tree": None, "early_exit_adapter": None,
               "mine": {"drafter": {"_target_": "tests.plugin_drafter.RepeatDrafter"}}}
    specs, _ = resolve_methods(methods, [], compose_config([]))
    labels = {s.name: s.drafter_label for s in name_custom_drafters(specs)}
    assert labels == {"ar": "none", "small_model_tree": "small_model_tree", "distilled_tree": "distilled_tree",
                      "early_exit_adapter": "early_exit_adapter", "mine": "repeat"}


# -- report figures say what data they show ------------------------------------------------------


def test_report_names_the_sample_and_warns_when_it_is_small(tmp_path):
    from spec_zoo.report.build import build_report, run_context
    from tests.test_report import fixture_records, write

    records = fixture_records()
    write(tmp_path / "run" / "results.jsonl", records)
    text = build_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert "> warning: small sample: 4 prompts (< 30)" in text
    context = run_context(records)
    assert context.subtitle == "n=4 prompts, target tiny, T=0.0, 1 thread(s)"
    for name in ("speedup_by_category", "tau_vs_speedup", "acceptance_by_position", "predicted_vs_measured"):
        assert (tmp_path / "out" / "figures" / f"{name}.png").stat().st_size > 0


def test_figure_axes_frame_the_data_not_zero():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spec_zoo.report.build import _around

    fig, ax = plt.subplots()
    _around(ax, [1.12, 1.31])
    low, high = ax.get_ylim()
    plt.close(fig)
    assert 0.9 < low < 1.0 and 1.31 < high < 1.4  # the baseline 1.0 is kept in view, 0 is not


def test_acceptance_counts_per_position():
    from spec_zoo.report.build import _records_reaching

    records = [{"method": "m", "accept_per_position": p} for p in ([0.9, 0.5, 0.2], [0.8], [0.7, 0.4], None)]
    assert _records_reaching(records, lambda r: r["method"], "m", 3) == [3, 2, 1]
