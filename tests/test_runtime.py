"""The compiled runtime (`spec_zoo.runtime.CompiledTarget`): batch-invariant scoring, the
static cache's crop / commit / gather, lossless decoding on it, its cost table and its errors.

One compiled target serves the module (compiling a tiny model takes ~10-20 s): its row
count is dynamic, padded to buckets (2, 4), so the invariance test also shows that padding
rows change nothing.
"""

from __future__ import annotations

import copy
import warnings
from unittest import mock

import pytest
import torch

from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.costs import CostTable, measure
from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.eagle.formats import Eagle3Head
from spec_zoo.drafters.early_exit.compiled import CompiledExit, ExitDraft
from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
from spec_zoo.drafters.medusa.drafter import MedusaDrafter
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.models import check_runtime
from spec_zoo.runtime import CompiledTarget
from spec_zoo.runtime.compile_cache import cached_compile, fingerprint
from spec_zoo.runtime.compiled import DRAFT_BLOCK
from spec_zoo.runtime.compiled_head import CHUNK, CompiledHead
from spec_zoo.runtime.cpp_kernels import host_isa
from spec_zoo.runtime.layers import DecoderStack
from spec_zoo.sampling import SamplingParams
from spec_zoo.testing import PROMPT, SETTINGS, goodness_of_fit, hf_greedy, sample_counts, sampling_model, tiny_llama
from spec_zoo.testing import exact_distribution as exact
from spec_zoo.trees import Static
from spec_zoo.verifiers.greedy import GreedyVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import MEDUSA_TREE, drafter_lineup, eagle_head, exit_adapter, medusa_heads, noisy_copy
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
    token are bit-identical whether 1 or up to 16 tokens are scored (chains and a tree)."""
    compiled.reset()
    alone = compiled.score(PROMPT, Draft.empty()).logits[0]
    for m in range(1, 16):
        compiled.reset()
        chain = compiled.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits
        assert torch.equal(chain[0], alone), f"M={m + 1}"
    compiled.reset()
    assert torch.equal(compiled.score(PROMPT, tree()).logits[0], alone)


def test_a_draft_row_equals_plain_decodings_row_once_its_path_is_committed(compiled):
    """What makes speculative output plain output, bit for bit: row i of a scored chain gets the
    logits plain decoding gets, one token per step, once the chain's first i tokens are committed
    (the attention kernel sums a path's keys as it sums them once they are prefix slots)."""
    chain = [3, 1, 4, 1, 5, 2, 6, 0, 7, 2, 2, 5]
    compiled.reset()
    rows = compiled.score(PROMPT, Draft.chain(chain)).logits
    compiled.reset()
    differ = [i for i in range(len(chain) + 1)
              if not torch.equal(compiled.score(PROMPT + chain[:i], Draft.empty()).logits[0], rows[i])]
    assert differ == []


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


@pytest.fixture(scope="module")
def compiled_draft(model):
    """One compiled draft model (the target with a perturbed LM head) for the module's drafters."""
    draft = CompiledTarget(noisy_copy(model, 1.0), max_cache_len=96, buckets=BUCKETS, key_block=16)
    draft.warm_up()
    return draft


@pytest.mark.parametrize("tree", [None, {"policy": "topk", "width": 2, "depth": 3}, "dynamic", "multi_draft"])
@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
def test_greedy_identity_with_a_compiled_draft_model(compiled, compiled_draft, model, tree, verifier):
    """A draft model on its own compiled graph and static cache (distilled/small_model with
    ``runtime=compiled``), chain or tree, beside the compiled target: the output is plain
    decoding's, token for token."""
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    drafter = SmallModelDrafter(compiled_draft, num_draft=3, adaptive=tree is None, sample=False, tree=tree)
    out = SpeculativeDecoder(compiled, drafter, verifier(), SamplingParams()).generate(PROMPT, max_new_tokens=24,
                                                                                       eos_token_ids=[])
    assert out.ids == plain == hf_greedy(model, PROMPT, 24)
    assert 0 < out.stats.accepted < out.stats.drafted  # the draft both helps and is corrected


@pytest.fixture(scope="module")
def compiled_head(model):
    """One compiled EAGLE head (untrained, over a reduced draft vocabulary; `spec_zoo.runtime.compiled_head`)
    for the module's drafters; a compile failure fails here instead of falling back."""
    stack, width = DecoderStack(model), model.config.hidden_size
    head = CompiledHead(eagle_head(model), stack.rotary, (width, width), (stack.inner.rotary_emb,), max_cache_len=96,
                        fallback=False)
    head.warm_up()
    return head


@pytest.mark.parametrize("tree", [None, {"policy": "topk", "width": 2, "depth": 3}, "dynamic"])
@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
def test_greedy_identity_with_a_compiled_eagle_head(compiled, compiled_head, model, tree, verifier):
    """The EAGLE head on its own compiled graph and static cache (``drafter.runtime=compiled``),
    chain or tree, beside the compiled target: the output is plain decoding's, and the head
    drafts what it drafts eagerly (the same tokens accepted of the same number drafted)."""
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    runs = []
    for head in (compiled_head, compiled_head.head):
        drafter = EagleDrafter(head, num_draft=3, adaptive=False, sample=False, tree=tree)
        runs.append(SpeculativeDecoder(compiled, drafter, verifier(), SamplingParams()).generate(
            PROMPT, max_new_tokens=24, eos_token_ids=[]))
    out, eager = runs
    assert drafter.compiled is None and EagleDrafter(compiled_head).runtime == "compiled"
    assert out.ids == plain == hf_greedy(model, PROMPT, 24)
    assert 0 < out.stats.accepted < out.stats.drafted  # the draft both helps and is corrected
    assert (out.stats.accepted, out.stats.drafted) == (eager.stats.accepted, eager.stats.drafted)


def test_seeded_sampling_with_a_compiled_eagle_head_is_reproducible(compiled, compiled_head):
    """Sampled drafts from the compiled head, rejection sampling: a seed gives one text."""
    texts = []
    for seed in (3, 3, 4):
        drafter = EagleDrafter(compiled_head, num_draft=3, tree="dynamic" if seed == 4 else None)
        decoder = SpeculativeDecoder(compiled, drafter, RejectionVerifier(), SETTINGS["t1"])
        texts.append(decoder.generate(PROMPT, max_new_tokens=16, eos_token_ids=[], seed=seed).ids)
    assert texts[0] == texts[1] != texts[2]


def test_the_compiled_target_hands_out_the_states_an_eagle3_head_reads(compiled, model):
    """``hand_out(layers)``: the compiled graph returns the states entering those layers side by
    side (as the eager forward's ``hidden_states``), for the prompt's eager prefill and the
    graph's rows alike, and its logits are the plain graph's bit for bit (plain decoding and
    EAGLE-3 verification run different graphs)."""
    layers, draft, width = (2, 0, 1), Draft.chain([1, 3, 2]), model.config.hidden_size
    prompt = (PROMPT * 30)[:30]  # past CATCH_UP: the prompt is prefilled eagerly, the last token by the graph

    def score(target, **hidden):
        target.reset()
        return target.score(prompt, draft, **hidden)

    eager, plain = score(Target(model), hidden=layers), score(compiled)
    try:
        compiled.hand_out(layers)
        fused, quiet = score(compiled, hidden=layers), score(compiled)  # quiet: the graph hand_out named serves it
    finally:
        compiled.hand_out(None)
    assert set(compiled._graphs) == {None, layers}
    assert fused.hidden.shape == (len(prompt) + len(draft), 3 * width)
    torch.testing.assert_close(fused.hidden, eager.hidden.float(), atol=1e-4, rtol=1e-4)
    assert torch.equal(fused.logits, plain.logits) and torch.equal(quiet.logits, plain.logits)
    assert not torch.equal(fused.hidden[:, :width], fused.hidden[:, width: 2 * width])  # three layers, not one thrice


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_greedy_identity_with_a_compiled_eagle3_head(compiled, model, tree):
    """An EAGLE-3 head (fused states of three layers, a reduced draft vocabulary) on its own
    compiled graph beside the compiled target, which hands the states out of its graph: the
    output is plain decoding's, and the head drafts what it drafts eagerly."""
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    vocab = model.lm_head.weight.shape[0]
    head = Eagle3Head.from_target(model, (0, 1, 1), init_layer=1, vocab_ids=torch.arange(vocab - vocab // 4))
    runs = []
    try:
        for runtime in ("compiled", "eager"):
            drafter = EagleDrafter(head, num_draft=3, adaptive=False, sample=False, tree=tree, runtime=runtime)
            runs.append(SpeculativeDecoder(compiled, drafter, GreedyVerifier(), SamplingParams()).generate(
                PROMPT, max_new_tokens=24, eos_token_ids=[]))
            assert (drafter.compiled is not None) == (runtime == "compiled")
    finally:
        compiled.hand_out(None)
    out, eager = runs
    assert out.ids == eager.ids == plain == hf_greedy(model, PROMPT, 24)
    assert 0 < out.stats.accepted < out.stats.drafted  # the draft both helps and is corrected
    assert (out.stats.accepted, out.stats.drafted) == (eager.stats.accepted, eager.stats.drafted)


def test_a_cascade_asks_the_target_for_its_eagle3_members_layers(compiled, model):
    """A cascade (or merge) asks for what its members read, known once they are attached: an
    EAGLE-3 member's layers (beside a lookup: plain decoding's output); a member reading the last
    layer beside it is refused when attached, by name, before any decoding."""
    from spec_zoo.drafters.cascade import CascadeDrafter

    head = Eagle3Head.from_target(model, (0, 1, 1), init_layer=1)
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    try:
        cascade = CascadeDrafter([NgramDrafter(), EagleDrafter(head, runtime="compiled")])
        out = SpeculativeDecoder(compiled, cascade).generate(PROMPT, max_new_tokens=24, eos_token_ids=[])
        assert cascade.needs_target_hidden == (0, 1, 1) and out.ids == plain and out.stats.drafted > 0
        with pytest.raises(ConfigError, match=r"members read different target states.*EAGLE-3 head cannot share"):
            SpeculativeDecoder(compiled, CascadeDrafter([MedusaDrafter(medusa_heads(model)), EagleDrafter(head)]))
    finally:
        compiled.hand_out(None)


@pytest.fixture(scope="module", params=["untrained exit", "exit adapter"])
def compiled_exit(model, request):
    """One compiled early-exit draft (layers 0..E-1 and the exit head, `drafters/early_exit/compiled.py`)
    for the module's drafters; a compile failure fails here instead of falling back."""
    adapter = exit_adapter(model) if request.param == "exit adapter" else None
    draft = CompiledExit(ExitDraft(model, 1, adapter), max_cache_len=96, fallback=False)
    draft.warm_up()
    return draft


@pytest.mark.parametrize("tree", [None, {"policy": "topk", "width": 2, "depth": 3}, "dynamic"])
@pytest.mark.parametrize("verifier", [GreedyVerifier, RejectionVerifier])
def test_greedy_identity_with_a_compiled_early_exit_draft(compiled, compiled_exit, model, tree, verifier):
    """Early exit's draft on its own compiled graph (``drafter.runtime=compiled``), chain or tree,
    beside the compiled target verifying with all its layers: the output is plain decoding's,
    and the draft proposes what it proposes eagerly (the same accepted of the same drafted)."""
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    runs = []
    for source in (compiled_exit, compiled_exit.head.adapter):
        drafter = EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=False, adapter=source, reuse_kv=False,
                                   tree=tree)
        runs.append(SpeculativeDecoder(compiled, drafter, verifier(), SamplingParams()).generate(
            PROMPT, max_new_tokens=24, eos_token_ids=[]))
    out, eager = runs
    assert drafter.compiled is None and drafter.runtime == "eager"
    assert out.ids == plain == hf_greedy(model, PROMPT, 24)
    assert 0 < out.stats.accepted <= out.stats.drafted
    assert (out.stats.accepted, out.stats.drafted) == (eager.stats.accepted, eager.stats.drafted)


def test_a_compiled_early_exit_draft_prefills_a_long_prompt_eagerly(compiled, compiled_exit, model):
    """A prompt longer than the graph's chunk goes to the draft in one eager forward
    (`CompiledExit.prefill`); the output is still plain decoding's."""
    prompt = [(5 * i + 1) % model.config.vocab_size for i in range(CHUNK + 6)]
    plain = SpeculativeDecoder(compiled).generate(prompt, max_new_tokens=12, eos_token_ids=[]).ids
    drafter = EarlyExitDrafter(1, num_draft=3, adaptive=False, sample=False, adapter=compiled_exit, reuse_kv=False)
    with mock.patch.object(CompiledExit, "prefill", autospec=True, side_effect=CompiledExit.prefill) as prefill:
        out = SpeculativeDecoder(compiled, drafter, GreedyVerifier(), SamplingParams()).generate(
            prompt, max_new_tokens=12, eos_token_ids=[])
    assert out.ids == plain and out.stats.drafted > 0
    assert prefill.call_count == 1 and prefill.call_args.args[2].shape[1] == len(prompt) - 1


def test_seeded_sampling_with_a_compiled_early_exit_draft_is_reproducible(compiled, compiled_exit):
    """Sampled drafts from the compiled early-exit graph, rejection sampling: a seed gives one text."""
    texts = []
    for seed in (3, 3, 4):
        drafter = EarlyExitDrafter(1, num_draft=3, adapter=compiled_exit, reuse_kv=False,
                                   tree="dynamic" if seed == 4 else None)
        decoder = SpeculativeDecoder(compiled, drafter, RejectionVerifier(), SETTINGS["t1"])
        texts.append(decoder.generate(PROMPT, max_new_tokens=16, eos_token_ids=[], seed=seed).ids)
    assert texts[0] == texts[1] != texts[2]


def test_a_compiled_early_exit_draft_is_refused_where_it_cannot_run(model):
    """KV reuse cannot go with a draft in its own static cache; a bad runtime is named. Nothing compiles."""
    with pytest.raises(ConfigError, match="set drafter.reuse_kv=false"):
        EarlyExitDrafter(1, runtime="compiled")
    with pytest.raises(ConfigError, match="drafter.runtime='turbo' is not a runtime"):
        EarlyExitDrafter(1, runtime="turbo", reuse_kv=False)
    wide = copy.deepcopy(model).double()
    with pytest.raises(ConfigError, match="drafter.runtime=compiled computes in float32 or bfloat16, not float64"):
        EarlyExitDrafter(1, runtime="compiled", reuse_kv=False).attach(Target(wide))


def test_a_compiled_eagle_head_runs_the_targets_attention(compiled, model):
    """The head's graph takes the compiled target's model.attention (a user without a compiler
    sets inductor once); an eager target leaves it the default. Nothing is compiled here."""
    inductor = CompiledTarget(model, max_cache_len=96, buckets=BUCKETS, key_block=16, attention="inductor")
    for target, attention in ((inductor, "inductor"), (compiled, "kernel"), (Target(model), "kernel")):
        drafter = EagleDrafter(eagle_head(model), runtime="compiled")
        drafter.attach(target)
        assert drafter.compiled.attention == attention


@pytest.mark.parametrize("tree", [None, "static"])
def test_greedy_identity_with_compiled_medusa_heads(compiled, model, tree):
    """Medusa's heads as one compiled graph (``drafter.runtime=compiled``), chain or static tree,
    beside the compiled target: greedy and rejection verification give plain decoding's output,
    and the compiled heads draft what the eager heads draft (the same accepted of the same
    drafted); sampling from them with a seed gives one text."""
    plain = SpeculativeDecoder(compiled).generate(PROMPT, max_new_tokens=24, eos_token_ids=[]).ids
    heads, shape = medusa_heads(model), Static(MEDUSA_TREE) if tree else None
    drafter = MedusaDrafter(heads, runtime="compiled", tree=shape)
    runs = {}
    for name, each in (("compiled", drafter), ("eager", MedusaDrafter(heads, tree=shape))):
        for verifier in (GreedyVerifier, RejectionVerifier):
            runs[name, verifier] = SpeculativeDecoder(compiled, each, verifier(), SamplingParams()).generate(
                PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert drafter.compiled is not None and drafter.compiled.compile_s is not None
    for verifier in (GreedyVerifier, RejectionVerifier):
        out, eager = runs["compiled", verifier], runs["eager", verifier]
        assert out.ids == plain == hf_greedy(model, PROMPT, 24)
        assert 0 < out.stats.accepted < out.stats.drafted  # the heads both help and are corrected
        assert (out.stats.accepted, out.stats.drafted) == (eager.stats.accepted, eager.stats.drafted)
    texts = [SpeculativeDecoder(compiled, drafter, RejectionVerifier(), SETTINGS["t1"]).generate(
        PROMPT, max_new_tokens=16, eos_token_ids=[], seed=seed).ids for seed in (3, 3, 4)]
    assert texts[0] == texts[1] != texts[2]


def test_a_compiled_eagle_head_is_refused_where_it_cannot_run(model):
    with pytest.raises(ConfigError, match="drafter.runtime='turbo' is not a runtime"):
        EagleDrafter(runtime="turbo")
    wide = copy.deepcopy(model).double()
    drafter = EagleDrafter(eagle_head(wide), runtime="compiled")
    with pytest.raises(ConfigError, match="drafter.runtime=compiled computes in float32 or bfloat16, not float64"):
        drafter.attach(Target(wide))
    with pytest.raises(ConfigError, match="drafter.runtime=compiled computes in float32 or bfloat16, not float64"):
        MedusaDrafter(medusa_heads(wide), runtime="compiled").attach(Target(wide))
    with pytest.raises(ConfigError, match="drafter.runtime='turbo' is not a runtime"):
        MedusaDrafter(runtime="turbo")


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


def test_a_second_compile_of_the_same_weights_is_read_from_the_cache(compiled, model):
    """Another target on the same weights gets its graph from inductor's on-disk cache (the
    session's tmp dir, `spec_zoo.runtime.compile_cache`) and scores bit for bit as the first; other
    weights of the same shape are keyed apart, so they cannot read the first one's packed weights."""
    again = CompiledTarget(copy.deepcopy(model), max_cache_len=96, buckets=BUCKETS, key_block=16)
    again.warm_up()
    assert again.compile_cached
    for target in (compiled, again):
        target.reset()
    assert torch.equal(again.score(PROMPT, tree()).logits, compiled.score(PROMPT, tree()).logits)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    assert fingerprint(other) != fingerprint(model)
    with cached_compile(fingerprint(other)):
        assert torch.compiler.config.cache_key_tag == fingerprint(other)


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
        CompiledTarget(model, buckets=(0, 4))
    with pytest.raises(ConfigError, match="model.buckets='fast'"):
        CompiledTarget(model, buckets="fast")
    with pytest.raises(ConfigError, match="model.max_cache_len=100000"):
        CompiledTarget(model, max_cache_len=100000)
    with pytest.raises(ConfigError, match="model.gemm='mkl'"):
        CompiledTarget(model, gemm="mkl")
    with pytest.raises(ConfigError, match="model.attention='flash'"):
        CompiledTarget(model, attention="flash")


def test_the_skinny_gemm_and_inductors_attention_keep_rows_and_tree_nodes_exact(model):
    """model.gemm=skinny (spec_zoo.runtime.skinny_gemm inside the compiled graph; no eager fallback) with
    model.attention=inductor (the formula's loops, not the default kernel; one compile for both
    non-default settings): row 0 is bit-identical for 1..16 scored tokens, and every tree node
    equals its path as a chain."""
    target = CompiledTarget(model, max_cache_len=96, buckets=BUCKETS, key_block=16, gemm="skinny",
                            attention="inductor", fallback=False)
    target.reset()
    alone = target.score(PROMPT, Draft.empty()).logits[0]
    for m in range(1, 16):
        target.reset()
        assert torch.equal(target.score(PROMPT, Draft.chain([(3 * j + 1) % 8 for j in range(m)])).logits[0], alone)
    draft = tree()
    target.reset()
    logits = target.score(PROMPT, draft).logits
    for node in range(len(draft)):
        target.reset()
        path = Draft.chain(draft.tokens[draft.path_to(node)])
        assert torch.equal(logits[node + 1], target.score(PROMPT, path).logits[-1])


def test_cost_table_is_measured_saved_and_read(compiled, tmp_path):
    table = measure(compiled, max_tokens=8, repeats=2, contexts=(4, 20), progress=False)
    assert len(table.seconds) == 8 and all(s > 0 for s in table.seconds)
    assert table.runtime == "compiled" and table.relative(1) == 1.0
    assert table.machine.endswith(host_isa())  # which unit ran it: AMX, AVX-512 (BF16), AVX2
    assert table.past == 4 and list(table.contexts) == ["20"] and len(table.contexts["20"]) == 8
    again = CostTable.load(table.save(tmp_path / "t.json"))
    assert again == table
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="spec-zoo costs"):
        CostTable.load(tmp_path / "bad.json")


def test_the_cost_at_a_context_interpolates_between_measured_ones():
    table = CostTable([1.0, 1.0, 2.0], "m", "compiled", "float32", 1, "x", past=64,
                      contexts={"1088": [3.0, 5.0, 8.0]})
    mid = table.at(600)  # halfway, once rounded down to its bucket (576)
    assert mid.seconds == [2.0, 3.0, 5.0] and mid.relative(3) == 2.5
    assert table.at(10).seconds == table.seconds and table.at(5000).seconds == table.contexts["1088"]
    assert table.at(620) is mid  # one interpolation per bucket of cached tokens
    assert CostTable([1.0], "m", "eager", "float32", 1, "x").at(900).seconds == [1.0]  # one curve: as it is


def test_the_decoder_prices_each_step_at_its_context(tiny_llama):
    seen = []

    class Watch(NgramDrafter):
        def propose(self, state):
            seen.append(state.cost_table.past)
            return super().propose(state)

    table = CostTable([1.0] * 4, "m", "eager", "float32", 1, "x", past=1, contexts={"400": [2.0] * 4})
    prompt = [1 + i % 50 for i in range(150)]
    SpeculativeDecoder(Target(tiny_llama()), Watch(), cost_table=table).generate(prompt, max_new_tokens=80)
    assert seen[0] == 128 and seen[-1] == 192 and seen == sorted(seen)


def test_relative_cost_extrapolates_past_the_table():
    table = CostTable([1.0, 1.0, 1.0, 1.0, 1.7], "m", "compiled", "float32", 1, "x")
    assert table.relative(4) == 1.0 and table.relative(5) == 1.7
    assert table.relative(7) == pytest.approx(1.7 + 2 * 0.35)  # the second half's mean slope: 0.7 over 2 rows
    noisy = CostTable([1.0, 1.4, 1.8, 2.2, 2.1], "m", "compiled", "float32", 1, "x")
    assert noisy.relative(6) == pytest.approx(2.1 + 0.15)  # a last pair's dip does not make rows free


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


def test_the_draft_length_prices_drafting_at_its_measured_cost():
    """A drafter's cost per drafted level measured into the table (`CostTable.drafts`, under its
    ``cost_key``) replaces the configured ``token_cost``: dear drafting shortens the draft (and
    a table without that drafter's entry keeps the configured cost)."""
    length = DraftLength(4, adaptive=True, maximum=8, token_cost=0.01, learn_cost=False)
    length.cost_key = "eagle"
    for _ in range(20):
        length.update(8, 6)  # acceptance ~0.85
    flat = [1.0] * 8
    cheap, dear = (CostTable(flat, "m", "compiled", "float32", 1, "x", drafts={"eagle": c}) for c in (0.01, 0.3))
    other = CostTable(flat, "m", "compiled", "float32", 1, "x", drafts={"medusa": 0.3})
    k = {name: length.choose(state=DecodeState([0], 1, 8, SamplingParams(), torch.Generator(), cost_table=table))
         for name, table in (("cheap", cheap), ("dear", dear), ("other", other))}
    assert k["dear"] < k["cheap"] == k["other"]


def test_spec_zoo_costs_measures_saves_and_plots_the_table(tmp_path, monkeypatch, capsys):
    """`spec-zoo costs` on a local model: the table lands where targets look it up, with a PNG."""
    from spec_zoo.api import build_decoder, compose_config
    from spec_zoo.cli import runtime_command
    from spec_zoo.costs import cached_table, table_path
    from spec_zoo.testing import tiny_llama

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    tiny_llama(3, dtype=torch.float32, max_position_embeddings=2048).save_pretrained(tmp_path / "m")
    runtime_command("costs", ["model=local", f"model.path={tmp_path / 'm'}"])
    printed = capsys.readouterr().out
    assert "M=1:" in printed and "M=32:" in printed and "after 1500 cached tokens" in printed
    target = Target(tiny_llama(3, dtype=torch.float32, max_position_embeddings=2048))
    table = cached_table(target)
    decoder = build_decoder(compose_config(["model=local", f"model.path={tmp_path / 'm'}"]), target=target)
    assert table is not None and len(table.seconds) == 32 and decoder.cost_table == table
    assert table.past == 100 and sorted(table.contexts) == ["1500", "500"]
    assert (tmp_path / "cache" / "costs").is_dir() and list((tmp_path / "cache" / "costs").glob("*.png"))
    with pytest.raises(ConfigError, match="model.runtime=eager has nothing to compile"):
        runtime_command("warmup", ["model=local", f"model.path={tmp_path / 'm'}", "model.runtime=eager"])
    runtime_command("costs", ["model=local", f"model.path={tmp_path / 'm'}", "drafter=ngram"])  # + its draft cost
    assert "drafting, per drafted level, in target steps t(1): ngram: " in capsys.readouterr().out
    after = cached_table(target)
    assert after is not None and set(after.drafts) == {"ngram"} and after.drafts["ngram"] > 0
    assert after.seconds == table.seconds and after.contexts == table.contexts  # t(M) kept, not measured again
    after.drafts["ngram"] = 50.0  # a stored cost that would stop the drafting: measuring drafts as if unmeasured
    after.save(table_path(target))
    runtime_command("costs", ["model=local", f"model.path={tmp_path / 'm'}", "drafter=ngram"])
    remeasured = cached_table(target)
    assert remeasured is not None and 0 < remeasured.drafts["ngram"] < 50.0


def test_spec_zoo_warmup_compiles_target_and_draft_and_says_what_the_cache_served(tmp_path, capsys, monkeypatch):
    """`spec-zoo warmup` (model.runtime=auto, the default: it compiles) with a compiled draft model
    compiles both, each line saying how long it took and whether the cache served it: the draft has
    the target's weights here, so its graph is the target's, read from the cache. A later run of the
    same target with model.runtime=auto then runs compiled."""
    from spec_zoo.api import compose_config, load_checked_target
    from spec_zoo.cli import runtime_command
    from spec_zoo.testing import tiny_llama

    monkeypatch.undo()  # conftest keeps auto eager in every other test
    tiny_llama(3, dtype=torch.float32).save_pretrained(tmp_path / "m")
    model = ["model=local", f"model.path={tmp_path / 'm'}", "model.max_cache_len=512"]
    assert type(load_checked_target(compose_config(model).model)) is Target  # nothing compiled yet
    runtime_command("warmup", [*model, "drafter=small_model", f"drafter.path={tmp_path / 'm'}",
                               "drafter.runtime=compiled"])
    target, draft = capsys.readouterr().out.splitlines()
    assert target.startswith("target: compiled in ") and target.endswith(")")
    assert draft.startswith("draft: compiled in ") and draft.endswith("(from the cache)")
    assert isinstance(load_checked_target(compose_config(model).model), CompiledTarget)


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


def test_a_graph_does_not_depend_on_what_the_process_compiled_before():
    """Only the dims `CompiledTarget._dynamic` marks are symbolic, whatever compiled before: with
    dynamo's automatic dynamic shapes, a second model of another depth got a symbolic layer
    count, so its kernels (and bf16 logits) depended on the first (Gemma 3's EAGLE-3 decoding
    left plain decoding at token 2 after the tiny families had compiled)."""
    import logging
    import re

    made: list[str] = []

    class Symbols(logging.Handler):
        def emit(self, record):
            found = re.search(r"create_symbol \S+ = \S+ for (\S+)", record.getMessage())
            if found:
                made.append(found.group(1))

    handler, log = Symbols(), logging.getLogger("torch.fx.experimental.symbolic_shapes")
    torch._logging.set_logs(dynamic=logging.INFO)
    log.addHandler(handler)
    try:
        symbols = []
        for seed, layers, cache in ((3, 2, 64), (4, 3, 80)):  # other depth, other cache: nothing shared
            made.clear()
            CompiledTarget(tiny_llama(seed=seed, layers=layers, dtype=torch.float32), max_cache_len=cache).warm_up()
            symbols.append(sorted(made))
    finally:
        log.removeHandler(handler)
        torch._logging.set_logs()
    inputs = ("ids", "positions", "mask", "draft_slots", "draft_mask", "row_cache", "write_at")
    assert symbols[0] and all(re.fullmatch(rf"L\['({'|'.join(inputs)})'\]\.size\(\)\[\d\]", s) for s in symbols[0])
    assert symbols[1] == symbols[0]


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


def test_more_graphs_of_one_function_than_dynamos_default_still_compile():
    """A line-up of compiled heads (or this test suite) compiles one Python function once per
    model; past dynamo's default of 8 graphs per code object (models of other depths here), a
    fullgraph compile would fail."""
    import torch._dynamo.config as dynamo_config

    from spec_zoo.runtime.compiled import compile_graph

    def graph_of(module):
        def fn(x):
            return module(x)
        return fn

    x = torch.randn(2, 4)
    with dynamo_config.patch(recompile_limit=8):  # torch's default, whatever ran before; restored after
        for i in range(10):
            module = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(i + 1)]).requires_grad_(False)
            graph, _, _ = compile_graph(graph_of(module), lambda f: f, (x,), f"recompile-test-{i}", "a test graph",
                                        "model", fallback=False)
            assert torch.allclose(graph(x), module(x))
