"""The compiled runtime (`spec_zoo.runtime.CompiledTarget`): batch-invariant scoring, the
static cache's crop / commit / gather, lossless decoding on it, its cost table and its errors.

One compiled target serves the module (compiling a tiny model takes ~10-20 s): its row
count is dynamic, padded to buckets (2, 4), so the invariance test also shows that padding
rows change nothing.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.costs import CostTable, measure
from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.models import check_runtime
from spec_zoo.runtime import DRAFT_BLOCK, CompiledTarget
from spec_zoo.sampling import SamplingParams
from spec_zoo.testing import PROMPT, SETTINGS, goodness_of_fit, hf_greedy, sample_counts, sampling_model
from spec_zoo.testing import exact_distribution as exact
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import drafter_lineup
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

BUCKETS = (2, 4)


@pytest.fixture(scope="module")
def model():
    return sampling_model().float()  # the compiled runtime computes in float32 (or bfloat16)


@pytest.fixture(scope="module")
def compiled(model):
    target = CompiledTarget(model, max_cache_len=96, buckets=BUCKETS, key_block=16)  # attention span grows often
    target.warm_up()
    return target


def tree() -> Draft:
    """Depth 3, two branches at the root and one inside: inner-node paths exist."""
    return Draft(torch.tensor([5, 2, 6, 3, 4, 7]), [-1, -1, 0, 0, 2, 1])


def test_row_logits_do_not_depend_on_how_many_tokens_are_scored(compiled):
    """Batch invariance, exactly: after the same prefix, the logits after the last committed
    token are bit-identical whether 1 or up to 8 tokens are scored (chains and a tree)."""
    compiled.reset()
    alone = compiled.score(PROMPT, Draft.empty()).logits[0]
    for m in range(1, 8):
        compiled.reset()
        chain = compiled.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits
        assert torch.equal(chain[0], alone), f"M={m + 1}"
    compiled.reset()
    assert torch.equal(compiled.score(PROMPT, tree()).logits[0], alone)


def test_tree_nodes_score_as_their_paths_do(compiled):
    """Every node of a tree gets, bit for bit, the logits its path gets when scored as a chain."""
    draft = tree()
    compiled.reset()
    logits = compiled.score(PROMPT, draft).logits
    for node in range(len(draft)):
        path = draft.path_to(node)
        compiled.reset()
        chain = compiled.score(PROMPT, Draft.chain(draft.tokens[path])).logits
        assert torch.equal(logits[node + 1], chain[-1]), f"node {node}"


def test_a_wide_tree_scores_its_paths_as_chains_do(compiled):
    """A tree wider than one gathered block of draft slots (DRAFT_BLOCK) still gives a node the
    logits its path gets as a chain, bit for bit: the extra block only adds exact zeros."""
    width = DRAFT_BLOCK + 4
    draft = Draft(torch.tensor([j % 8 for j in range(width + 2)]), [-1] * width + [0, width])
    compiled.reset()
    logits = compiled.score(PROMPT, draft).logits
    for node in (0, width - 1, width, width + 1):
        compiled.reset()
        chain = compiled.score(PROMPT, Draft.chain(draft.tokens[draft.path_to(node)])).logits
        assert torch.equal(logits[node + 1], chain[-1]), f"node {node}"


@pytest.mark.parametrize("path", [[0, 2, 4], [1, 5], [0, 3]])
def test_commit_of_a_tree_path_equals_a_fresh_prefill(compiled, model, path):
    """Gathering an accepted (deep, inner-node, or second-branch) path into place leaves the
    static cache as a fresh prefill of the same tokens would: the next logits agree with the
    eager reference."""
    draft = tree()
    compiled.reset()
    compiled.score(PROMPT, draft)
    compiled.commit(path)
    committed = PROMPT + [int(draft.tokens[i]) for i in path] + [1]
    after = compiled.score(committed, Draft.chain([2, 3])).logits
    reference = Target(model).score(committed, Draft.chain([2, 3])).logits
    torch.testing.assert_close(after, reference, rtol=1e-4, atol=1e-4)


def test_crop_after_a_rejection_reuses_the_accepted_prefix(compiled, model):
    compiled.reset()
    compiled.score(PROMPT, Draft.chain([5, 2, 6, 3]))
    committed = PROMPT + [5, 2, 7]  # two accepted, then the target's own token
    logits = compiled.score(committed, Draft.chain([1])).logits
    assert compiled.cached_tokens[: len(PROMPT) + 2] == PROMPT + [5, 2]
    torch.testing.assert_close(logits, Target(model).score(committed, Draft.chain([1])).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("drafter", ["ngram_k4_adaptive", "small_chain_self", "small_tree_2x3", "eagle_k3",
                                     "early_exit_k3", "merge_tree_eagle_ngram"])
@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
def test_greedy_identity_on_the_compiled_runtime(compiled, model, drafter, verifier):
    """Speculative decoding on the compiled runtime equals plain decoding on it token for
    token, and both equal transformers' greedy decoding of the eager model."""
    lineup = drafter_lineup(model)
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    spec = SpeculativeDecoder(compiled, lineup[drafter](), verifier(), SamplingParams())
    out = spec.generate(PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert out.ids == plain == hf_greedy(model, PROMPT, 24)


def test_sampling_follows_the_target_on_the_compiled_runtime(compiled, model):
    """Chi-square: rejection sampling with a sampled small-model chain on the compiled runtime."""
    sampling = SETTINGS["t1"]
    decoder = SpeculativeDecoder(compiled, drafter_lineup(model, sampled=True)["small_chain_k3"](),
                                 RejectionVerifier(), sampling)
    pvalue = goodness_of_fit(sample_counts(decoder, 1000), exact(model, sampling))
    assert pvalue > 1e-3


def test_a_sequence_longer_than_the_static_cache_is_refused_by_name(compiled):
    with pytest.raises(ConfigError, match="model.max_cache_len"):
        SpeculativeDecoder(compiled).generate(list(range(8)) * 12, max_new_tokens=4, eos_token_ids=[])
    compiled.reset()
    with pytest.raises(ConfigError, match="model.max_cache_len=96"):
        compiled.score(list(range(8)) * 11 + [1, 2, 3], Draft.chain([1] * 8))


def test_a_compile_failure_falls_back_to_eager_with_a_warning(model, monkeypatch):
    def broken(*args, **kwargs):
        def fail(*a, **k):
            raise RuntimeError("inductor exploded")
        return fail

    monkeypatch.setattr(torch, "compile", broken)
    target = CompiledTarget(model, max_cache_len=64)
    with pytest.warns(RuntimeWarning, match="compiling failed.*inductor exploded.*running eagerly"):
        ids = SpeculativeDecoder(target).generate(PROMPT, max_new_tokens=6, eos_token_ids=[]).ids
    assert ids == hf_greedy(model, PROMPT, 6)
    strict = CompiledTarget(model, max_cache_len=64, fallback=False)
    with pytest.raises(RuntimeError, match="inductor exploded"), warnings.catch_warnings():
        warnings.simplefilter("error")
        strict.warm_up()


@pytest.mark.parametrize("runtime,dtype,device,match", [
    ("turbo", "float32", "cpu", "model.runtime='turbo' is not a runtime; use one of: eager, compiled"),
    ("compiled", "float64", "cpu", "computes in float32 or bfloat16, not float64; set model.dtype=float32"),
    ("compiled", "float32", "cuda", "runs on the CPU"),
])
def test_a_runtime_the_machine_cannot_run_is_refused_before_loading(runtime, dtype, device, match):
    with pytest.raises(ConfigError, match=match):
        check_runtime(runtime, dtype, device)


def test_bfloat16_needs_a_cpu_that_computes_it(monkeypatch):
    import spec_zoo.models as models

    monkeypatch.setattr(models, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError, match="AVX-512 BF16 or AMX"):
        check_runtime("compiled", "bfloat16", "cpu")


def test_bad_buckets_and_cache_length_are_refused(model):
    with pytest.raises(ConfigError, match="model.buckets"):
        CompiledTarget(model, buckets=(1, 4))
    with pytest.raises(ConfigError, match="model.max_cache_len=100000"):
        CompiledTarget(model, max_cache_len=100000)


def test_cost_table_is_measured_saved_and_read(compiled, tmp_path):
    table = measure(compiled, max_tokens=8, repeats=2, progress=False)
    assert len(table.seconds) == 8 and all(s > 0 for s in table.seconds)
    assert table.runtime == "compiled" and table.relative(1) == 1.0
    again = CostTable.load(table.save(tmp_path / "t.json"))
    assert again == table
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="spec-zoo costs"):
        CostTable.load(tmp_path / "bad.json")


def test_relative_cost_extrapolates_past_the_table():
    table = CostTable([1.0, 1.0, 1.0, 1.0, 1.7], "m", "compiled", "float32", 1, "x")
    assert table.relative(4) == 1.0 and table.relative(5) == 1.7
    assert table.relative(7) == pytest.approx(1.7 + 2 * 0.7)


def test_the_draft_length_follows_the_cost_table():
    """With scoring flat up to 4 tokens and a jump at 5, a well-accepted drafter drafts 3
    tokens (4 scored), where the linear prior would draft longer."""
    length = DraftLength(4, adaptive=True, maximum=8, token_cost=0.01, learn_cost=False)
    for _ in range(20):
        length.update(8, 8)  # everything accepted: acceptance near 1
    assert length.choose() == 8
    step = CostTable([1.0, 1.0, 1.0, 1.0, 3.0, 3.2, 3.4, 3.6, 3.8], "m", "compiled", "float32", 1, "x")
    state = DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=step)
    assert length.choose(state=state) == 3


def test_spec_zoo_costs_measures_saves_and_plots_the_table(tmp_path, monkeypatch, capsys):
    """`spec-zoo costs` on a local model: the table lands where targets look it up, with a PNG."""
    from spec_zoo.api import build_decoder, compose_config
    from spec_zoo.cli import runtime_command
    from spec_zoo.costs import cached_table
    from spec_zoo.testing import tiny_llama

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    tiny_llama(3, dtype=torch.float32).save_pretrained(tmp_path / "m")
    runtime_command("costs", ["model=local", f"model.path={tmp_path / 'm'}"])
    printed = capsys.readouterr().out
    assert "M=1:" in printed and "M=16:" in printed
    target = Target(tiny_llama(3, dtype=torch.float32))
    table = cached_table(target)
    decoder = build_decoder(compose_config(["model=local", f"model.path={tmp_path / 'm'}"]), target=target)
    assert table is not None and len(table.seconds) == 16 and decoder.cost_table == table
    assert (tmp_path / "cache" / "costs").is_dir() and list((tmp_path / "cache" / "costs").glob("*.png"))
    with pytest.raises(ConfigError, match="model.runtime=eager has nothing to compile"):
        runtime_command("warmup", ["model=local", f"model.path={tmp_path / 'm'}"])


def test_bfloat16_scoring_is_batch_invariant_too():
    """bfloat16 on the compiled runtime (this CPU computes it natively): rows are still
    bit-identical for M = 1..4 and tree nodes equal their paths, so speculative bf16
    decoding equals plain bf16 decoding."""
    target = CompiledTarget(sampling_model().to(torch.bfloat16), max_cache_len=64)
    target.reset()
    alone = target.score(PROMPT, Draft.empty()).logits[0]
    for m in range(1, 4):
        target.reset()
        assert torch.equal(target.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits[0], alone)
    draft = Draft(torch.tensor([5, 2, 6]), [-1, -1, 0])
    target.reset()
    logits = target.score(PROMPT, draft).logits
    for node in range(3):
        target.reset()
        chain = target.score(PROMPT, Draft.chain(draft.tokens[draft.path_to(node)])).logits[-1]
        assert torch.equal(logits[node + 1], chain)


def test_a_draft_model_on_the_compiled_runtime_stays_lossless(compiled, model):
    """`drafter.runtime=compiled`: the draft model gets its own static cache and graphs."""
    from spec_zoo.drafters.small_model import SmallModelDrafter
    from tests.drafts import noisy_copy

    drafter = SmallModelDrafter(noisy_copy(model, 1.0), num_draft=3, runtime="compiled")
    assert isinstance(drafter.runner, CompiledTarget)
    out = SpeculativeDecoder(compiled, drafter).generate(PROMPT, max_new_tokens=16, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 16) and out.stats.alpha > 0
    with pytest.raises(ConfigError, match="drafter.runtime=compiled computes in"):
        SmallModelDrafter(noisy_copy(model, 1.0), runtime="compiled", dtype="float64")


def test_compiles_after_the_model_was_asked_for_its_hidden_states(model):
    """An eager `model(..., output_hidden_states=True)` (EAGLE, Medusa) installs capture hooks on
    the shared model's layers; the compiled runtime must still compile (no eager fallback)."""
    Target(model).score(PROMPT, Draft.chain([1, 2]), hidden=True)
    target = CompiledTarget(model, max_cache_len=64, fallback=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        target.warm_up()
    out = SpeculativeDecoder(target).generate(PROMPT, max_new_tokens=6, eos_token_ids=[])
    assert out.ids == hf_greedy(model, PROMPT, 6)
