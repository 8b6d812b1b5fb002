"""The model-family matrix: every family of `spec_zoo.testing.FAMILIES` x drafter x runtime on
tiny random models (hidden 64, 2 layers, float64; sliding windows of 8, shorter than the
39-token sequences; Gemma soft-capping on). A cell either decodes exactly what transformers'
``generate`` does (greedy) or is a one-line `ConfigError` raised while the decoder is built,
before any decoding; which cells refuse is asserted too.

Sampled paths: on the soft-capped families every logits row the verifier reads is checked
against the model's own forward on that context (the distribution it verifies against IS the
target's; the rejection rule's exactness given those rows is proven in test_sampling_exact.py),
and the check catches the old KV-reuse path that skipped the logit soft-cap.

The compiled runtime: every family is built on it (its refusals are checked everywhere), and
every family it serves decodes through its graph function run without compiling (the
row-wise attention, the static cache and the logits exactly as the graph computes them; the
runtime's own fallback path), with windows as long as the static cache. Compiling takes
minutes here, so one family compiles, once for the module: Gemma 2 (soft-capping on both
attention and logits, sliding and full layers; ATen GEMMs so the compile is short).

The table in docs/families.md is this matrix: ``python -m tests.test_families`` writes it,
and the last test fails when the page is not what this run found.
"""

from __future__ import annotations

import functools
from pathlib import Path
from unittest import mock

import pytest
import torch
from transformers import AutoModelForCausalLM

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.draft import Draft
from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.eagle.head import EagleHead
from spec_zoo.drafters.early_exit.compiled import CompiledExit, ExitDraft
from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.none import NoDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.models import make_truncated_draft
from spec_zoo.runtime import CompiledTarget
from spec_zoo.testing import FAMILIES, hf_greedy, repetitive_prompt, tiny_family
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import noisy_copy
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "families.md"
PROMPT, NEW = repetitive_prompt(0), 20  # 39 tokens, windows of 8
COMPILED_CACHE = 64  # the compiled target's max_cache_len
COMPILED_FAMILY = "gemma2"  # decoded on the compiled runtime, with sliding_window=COMPILED_CACHE
COMPILED_ROW = f"{COMPILED_FAMILY}, window {COMPILED_CACHE}"
SOFTCAPPED = ("gemma2", "gemma3")


@functools.cache
def model(family: str):
    return tiny_family(family)


@functools.cache
def truncated(target_model):
    """The target cut to its first layer by `make_truncated_draft` (the ``small_model`` default),
    loaded back: every family's layer list must be found and filtered."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        make_truncated_draft(target_model, 1, tmp)
        experts = target_model.config._experts_implementation  # not saved; float64 MoE needs "eager"
        return AutoModelForCausalLM.from_pretrained(tmp, dtype=target_model.dtype,
                                                    experts_implementation=experts).eval()


def eagle(target_model, **kw):
    head = EagleHead(target_model, init_layer=target_model.config.num_hidden_layers - 1, mlp=True).eval()
    return EagleDrafter(head, num_draft=3, adaptive=False, **kw)


def compiled_exit(target_model, sample):
    """Early exit's compiled draft (`drafters/early_exit/compiled.py`), its graph function run
    without compiling, as the runtime's columns below run the target's."""
    draft = CompiledExit(ExitDraft(target_model, 1), max_cache_len=COMPILED_CACHE)
    with mock.patch.object(torch, "compile", lambda fn, **_: fn):
        draft.warm_up()
    return EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=sample, adapter=draft, reuse_kv=False)


DRAFTERS = {  # name -> (target model, sample mode) -> drafter
    "none": lambda m, s: NoDrafter(),
    "ngram": lambda m, s: NgramDrafter(num_draft=4, adaptive=False),
    "ngram tree": lambda m, s: NgramDrafter(num_draft=4, adaptive=False, branches=3, max_nodes=10),
    "small_model": lambda m, s: SmallModelDrafter(noisy_copy(m, 1.0), num_draft=3, sample=s),
    "small_model tree": lambda m, s: SmallModelDrafter(noisy_copy(m, 1.0), tree_width=2, tree_depth=3, sample=s),
    "small_model truncated": lambda m, s: SmallModelDrafter(truncated(m), num_draft=3, sample=s),
    "early_exit": lambda m, s: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=s),
    "early_exit own cache": lambda m, s: EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=s, reuse_kv=False),
    "eagle": lambda m, s: eagle(m, sample=s),
}
COMPILED_ONLY = {"early_exit compiled draft": compiled_exit}  # drafters that need the compiled runtime's float32
COMPILED_DRAFTERS = ("none", "ngram tree", "small_model", "early_exit", "early_exit compiled draft", "eagle")

NOT_LLAMA_LAYOUT = ("gpt2", "gpt_neox")
WINDOWED = ("qwen2", "mistral", "gemma2", "gemma3", "phi3")  # windows shorter than the compiled cache
REFUSED = {  # (family, drafter, runtime) that must be refused, by a message containing this
    **{(f, d, "eager"): "Llama-family"
       for f in NOT_LLAMA_LAYOUT for d in ("early_exit", "early_exit own cache", "eagle")},
    ("olmo2", "eagle", "eager"): "not a pre-norm block",
    **{(f, "none", "compiled"): "Llama-family" for f in NOT_LLAMA_LAYOUT},
    **{(f, "none", "compiled"): "sliding-window attention" for f in WINDOWED},
}


@functools.cache
def wide_model(family: str):
    """``family`` in float32 (the compiled runtime's precision) with windows as long as its
    cache (it refuses shorter ones)."""
    return tiny_family(family, dtype=torch.float32,
                       **({"sliding_window": COMPILED_CACHE} if family in WINDOWED else {}))


@functools.cache
def reference(target_model) -> tuple[int, ...]:
    return tuple(hf_greedy(target_model, PROMPT, NEW))


def uncompiled_target(target_model) -> CompiledTarget:
    """A `CompiledTarget` whose graph function runs as it is (``torch.compile`` made the identity)."""
    target = CompiledTarget(target_model, max_cache_len=COMPILED_CACHE, buckets=(2, 4), key_block=16)
    with mock.patch.object(torch, "compile", lambda fn, **_: fn):
        target.warm_up()
    return target


@functools.cache
def compiled_target():
    m = tiny_family(COMPILED_FAMILY, dtype=torch.float32, sliding_window=COMPILED_CACHE)
    target = CompiledTarget(m, max_cache_len=COMPILED_CACHE, buckets=(2, 4), key_block=16, gemm_backends="ATEN",
                            fallback=False)
    target.warm_up()
    return target, tuple(hf_greedy(m, PROMPT, NEW))


def decode(target, drafter, sampling=None, verifier=None, seed=0) -> list[int]:
    decoder = SpeculativeDecoder(target, drafter, verifier or GreedyVerifier(), sampling or SamplingParams())
    return decoder.generate(PROMPT, max_new_tokens=NEW, eos_token_ids=[], seed=seed).ids


@functools.cache
def outcome(family: str, drafter: str, runtime: str) -> str:
    """'equal' (greedy output == transformers' generate), 'built' (a compiled target built, not
    decoded) or 'refused: <the one-line error>' (raised while building the target or decoder);
    a different output or any other error fails. Runtimes: eager, compiled (built only; the
    family COMPILED_ROW compiles and decodes) and uncompiled (the compiled runtime's graph
    function, not compiled, on `wide_model`)."""
    try:
        if family == COMPILED_ROW:
            target, expected = compiled_target()
            target_model = target.model
        elif runtime == "compiled":
            CompiledTarget(model(family), max_cache_len=COMPILED_CACHE)  # refused here, or compiled on first use
            return "built"
        else:
            target_model = model(family) if runtime == "eager" else wide_model(family)
            target = Target(target_model) if runtime == "eager" else uncompiled_target(target_model)
            expected = reference(target_model)
        drafter_of = DRAFTERS.get(drafter) or COMPILED_ONLY[drafter]
        decoder = SpeculativeDecoder(target, drafter_of(target_model, False), GreedyVerifier(), SamplingParams())
    except ConfigError as err:
        assert "\n" not in str(err), f"{family} x {drafter} ({runtime}): a refusal must be one line: {err}"
        return f"refused: {err}"
    ids = decoder.generate(PROMPT, max_new_tokens=NEW, eos_token_ids=[]).ids
    assert tuple(ids) == expected, f"{family} x {drafter} ({runtime}): output differs from transformers' generate"
    return "equal"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_decoding_equals_generate_or_is_refused_before_work(family, drafter):
    result = outcome(family, drafter, "eager")
    if (family, drafter, "eager") in REFUSED:
        assert result.startswith("refused:") and REFUSED[family, drafter, "eager"] in result, result
    else:
        assert result == "equal", result


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_compiled_runtime_builds_or_refuses_by_name(family):
    result = outcome(family, "none", "compiled")
    if (family, "none", "compiled") in REFUSED:
        assert result.startswith("refused:") and REFUSED[family, "none", "compiled"] in result, result
    else:
        assert result == "built", result


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("drafter", COMPILED_DRAFTERS)
def test_the_compiled_runtimes_graph_equals_generate_in_every_family_it_serves(family, drafter):
    result = outcome(family, drafter, "uncompiled")
    if family in NOT_LLAMA_LAYOUT:
        assert result.startswith("refused:") and "Llama-family" in result, result
    elif (refused := REFUSED.get((family, drafter.removesuffix(" compiled draft"), "eager"))) is not None:
        assert result.startswith("refused:") and refused in result, result
    else:
        assert result == "equal", result


@pytest.mark.parametrize("drafter", COMPILED_DRAFTERS)
def test_gemma2_on_the_compiled_runtime_equals_generate(drafter):
    """Soft-capped attention and logits, sliding and full layer types, one compile."""
    assert outcome(COMPILED_ROW, drafter, "compiled") == "equal"


def recording(target):
    """``target``, keeping every (committed, draft, logits) it scores in ``target.seen``."""
    target.seen, score = [], target.score

    def recorded(committed, draft, hidden=False):
        scores = score(committed, draft, hidden)
        target.seen.append((list(committed), draft, scores.logits.clone()))
        return scores

    target.score = recorded
    return target


def own_logits(m, committed: list[int], draft: Draft) -> torch.Tensor:
    """The model's own forward's logits for every row `Target.score` returns."""
    rows = [m(torch.tensor([committed])).logits[0, -1]]
    for node in range(len(draft)):
        path = draft.tokens[draft.path_to(node)].tolist()
        rows.append(m(torch.tensor([committed + path])).logits[0, -1])
    return torch.stack(rows)


def assert_rows_are_the_models(m, drafter, sampling, target=None, atol=1e-5) -> int:
    """Sampled decoding with ``drafter`` (on ``target``, default an eager one): every logits row
    the verifier read equals the model's own forward on that context (up to ``atol``; 1e-5 in
    float64: Gemma 2's eager attention takes its softmax in float32, while a soft-cap or window
    error is of the order of the logits themselves); returns the number of rows checked."""
    target = recording(target or Target(m))
    with torch.no_grad():
        for seed in range(3):
            decode(target, drafter, sampling, RejectionVerifier(), seed=seed)
        for committed, draft, logits in target.seen:
            torch.testing.assert_close(logits, own_logits(m, committed, draft), rtol=0, atol=atol)
    return sum(len(draft) + 1 for _, draft, _ in target.seen)


@pytest.mark.parametrize("family", SOFTCAPPED)
@pytest.mark.parametrize("drafter", ["early_exit", "early_exit own cache", "small_model tree", "ngram"])
def test_sampled_paths_verify_against_the_models_own_logits(family, drafter):
    m = model(family)
    assert m.config.final_logit_softcapping is not None
    assert assert_rows_are_the_models(m, DRAFTERS[drafter](m, "auto"), SamplingParams(temperature=0.7)) >= 3 * NEW


@pytest.mark.parametrize("family", SOFTCAPPED)
@pytest.mark.parametrize("drafter", ["early_exit", "small_model"])
def test_the_compiled_runtimes_graph_verifies_against_the_models_own_logits(family, drafter):
    m = wide_model(family)
    rows = assert_rows_are_the_models(m, DRAFTERS[drafter](m, "auto"), SamplingParams(temperature=0.7),
                                      uncompiled_target(m), atol=1e-4)
    assert rows >= 3 * NEW


def test_compiled_sampled_early_exit_verifies_against_the_models_own_logits():
    target, _ = compiled_target()
    m = target.model
    rows = assert_rows_are_the_models(m, DRAFTERS["early_exit"](m, "auto"), SamplingParams(temperature=0.7),
                                      target, atol=1e-4)
    assert rows >= 3 * NEW


def test_a_resume_without_the_models_softcapping_is_caught(monkeypatch):
    """The check above fails the old bug: KV reuse verifying with lm_head(norm(h)) alone."""
    import spec_zoo.partial

    monkeypatch.setattr(spec_zoo.partial, "final_logits", lambda m, normed: m.lm_head(normed))
    m = model("gemma2")
    with pytest.raises(AssertionError):
        assert_rows_are_the_models(m, DRAFTERS["early_exit"](m, "auto"), SamplingParams(temperature=0.7))


@pytest.mark.parametrize("runtime", ["eager", "compiled"])
def test_a_model_whose_forward_the_layer_path_would_not_reproduce_is_refused_before_work(runtime):
    """The layer-by-layer path is checked against the model's own forward: here it would
    soft-cap logits the model (a Llama, which has no such key) does not."""
    m = tiny_family("llama", dtype=torch.float32)
    m.config.final_logit_softcapping = 0.5
    with pytest.raises(ConfigError, match="differs from the model's own"):
        if runtime == "eager":
            SpeculativeDecoder(Target(m), DRAFTERS["early_exit"](m, False))
        else:
            CompiledTarget(m, max_cache_len=COMPILED_CACHE)


# -- the page ------------------------------------------------------------------------------------
def cell(result: str, notes: list[str]) -> str:
    if result in ("equal", "built"):
        return "✓" if result == "equal" else "built"
    if result not in notes:
        notes.append(result)
    return f"refused [{notes.index(result) + 1}]"


def page() -> str:
    """docs/families.md from this run's outcomes (cells not yet run are run now)."""
    notes: list[str] = []
    names = list(DRAFTERS)
    lines = [
        "# Model families",
        "",
        "<!-- generated by `python -m tests.test_families` from the matrix of tests/test_families.py; do not edit -->",
        "",
        "Every family x drafter x runtime cell on a tiny random model (hidden 64, 2 layers; float64,",
        "float32 on the compiled runtime; sliding windows of 8 tokens, shorter than the 39-token",
        "sequences; Gemma soft-capping on):",
        "✓ = greedy output equal to transformers' `generate`, token for token; refused = a one-line",
        "`ConfigError` raised while the decoder is built, before any decoding (the notes give it).",
        "Sampled decoding on Gemma 2 and 3 (early exit with and without KV reuse, small-model trees,",
        "n-gram) verifies against logits equal to the model's own forward, row for row.",
        "",
        "## Eager runtime",
        "",
        "| family | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for family in FAMILIES:
        lines.append(f"| {family} | " + " | ".join(cell(outcome(family, d, "eager"), notes) for d in names) + " |")
    lines += [
        "",
        "## Compiled runtime",
        "",
        f"*built*: the family built on it with `model.max_cache_len={COMPILED_CACHE}` (the refusals come",
        "here, before any compiling). The drafter columns decode through the runtime's graph function",
        "run without compiling (row-wise attention, static cache, logits: what the graph computes; the",
        f"runtime's own fallback path), on the family with windows of {COMPILED_CACHE}. Compiles take",
        f"minutes on a small CPU, so one row is compiled: {COMPILED_FAMILY} with a window of {COMPILED_CACHE}",
        "(soft-capped attention and logits, sliding and full layers), one compile shared by its",
        "drafters (tests/test_runtime.py compiles a Llama model for every drafter).",
        "",
        "| family | built | " + " | ".join(COMPILED_DRAFTERS) + " |",
        "|---" * (len(COMPILED_DRAFTERS) + 2) + "|",
    ]
    for family in FAMILIES:
        built = cell(outcome(family, "none", "compiled"), notes)
        decoded = [cell(outcome(family, d, "uncompiled"), notes) for d in COMPILED_DRAFTERS]
        lines.append(f"| {family} | {built} | " + " | ".join(decoded) + " |")
    decoded = [cell(outcome(COMPILED_ROW, d, "compiled"), notes) for d in COMPILED_DRAFTERS]
    lines.append(f"| {COMPILED_ROW}, **compiled** | built | " + " | ".join(decoded) + " |")
    lines += ["", "Notes:", ""] + [f"{i}. {note.removeprefix('refused: ')}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


def test_the_docs_page_is_this_matrix():
    assert PAGE.read_text() == page(), "docs/families.md is stale: run `python -m tests.test_families`"


if __name__ == "__main__":
    torch.set_num_threads(1)
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
