"""Lossless, certified (spec_zoo/certify.py): the exact law of the generated tokens of a
drafter x verifier pair, by enumerating every random choice of the decode.

Here: the enumeration itself, that every random choice goes through spec_zoo.sampling
(grep), a covering subset of the certification table (tests/certify_table.py; the whole
table is docs/certification_table.md), six broken rules each caught with TV >= 1e-3, and
exact expectations (the block-verification paper's 10/9 vs 11/9, never worse than
rejection)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from spec_zoo import SamplingParams
from spec_zoo.certify import Enumerator, categorical, certify, coin, ordered_distinct
from spec_zoo.draft import ROOT, Draft
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import Verdict
from spec_zoo.sampling import accept, choosing, logits_to_probs, sample, sample_distinct
from spec_zoo.testing import CERTIFY_PROMPT, CERTIFY_SETTINGS, MAX_TV, assert_lossless, certify_model, tiny_llama
from spec_zoo.trees import MultiDraft, Static
from spec_zoo.verifiers import block
from spec_zoo.verifiers.block import BlockVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier, proposal
from tests import certify_table
from tests.drafts import noisy_copy
from tests.tiny import one_thread  # noqa: F401 (autouse fixture)

ROOT_DIR = Path(__file__).parents[1]
T1, T07 = CERTIFY_SETTINGS["t1"], CERTIFY_SETTINGS["t0.7_topk3_topp0.75"]
T07_P09 = SamplingParams(temperature=0.7, top_k=3, top_p=0.9)  # top-p keeps more tokens: more for a rule to get wrong
CAUGHT = 1e-3  # a broken rule's exact TV must reach this


@pytest.fixture(scope="module")
def model():
    return certify_model()


@pytest.fixture(scope="module")
def draft(model):
    return noisy_copy(model, 1.0)


def small(draft, **kw):
    return lambda m: SmallModelDrafter(draft, adaptive=False, **kw)


# -- the enumeration ---------------------------------------------------------------------


def test_outcomes_are_the_primitives_laws():
    q = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64)
    assert categorical(q) == [(0, 0.5), (2, 0.3), (3, pytest.approx(0.2))]
    pairs = dict((tuple(x), p) for x, p in ordered_distinct(q, 2))
    assert len(pairs) == 6 and sum(pairs.values()) == pytest.approx(1.0, abs=1e-15)
    assert pairs[(0, 2)] == pytest.approx(0.5 * 0.3 / 0.5) and pairs[(2, 0)] == pytest.approx(0.3 * 0.5 / 0.7)
    assert coin(0.2, 0.5) == [(True, 0.4), (False, 0.6)] and coin(0.3, 0.0) == [(True, 1.0)]
    assert coin(0.0, 0.0) == [(False, 1.0)] and coin(0.7, 0.5) == [(True, 1.0)]


def test_the_enumerator_replays_then_branches():
    q = torch.tensor([0.25, 0.75], dtype=torch.float64)
    with choosing(Enumerator([(1, 2)])) as run:
        first, second = int(sample(q, None)), accept(torch.tensor(0.1), torch.tensor(0.4), None)
        third = sample_distinct(q, 2, None)
    assert (first, second, third) == (1, True, [0, 1]) and run.probability == pytest.approx(0.75 * 0.25 * 0.25)
    with choosing(Enumerator([(0, 3)])), pytest.raises(RuntimeError, match="not a function of its random choices"):
        sample(q, None)


def test_the_default_chooser_uses_the_generator():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    draws = [int(sample(q, torch.Generator().manual_seed(s))) for s in range(3)]
    assert draws == [int(torch.multinomial(q, 1, generator=torch.Generator().manual_seed(s))) for s in range(3)]


def test_no_random_draw_outside_the_primitives():
    """Every random choice of a decode goes through spec_zoo.sampling, so certify sees all of
    them (training code shuffles data, the benchmark bootstraps its statistics, the test
    harness builds random models and prompts)."""
    pattern = re.compile(r"multinomial|torch\.rand\b|rand_like|randn|randint|randperm|bernoulli|np\.random"
                         r"|\brandom\.(random|choice|choices|shuffle|sample|uniform)\b")
    allowed = {"spec_zoo/sampling.py", "spec_zoo/testing.py"}
    offenders = []
    for folder in ("spec_zoo", "drafters", "verifiers"):
        for path in sorted((ROOT_DIR / folder).rglob("*.py")):
            rel = path.relative_to(ROOT_DIR).as_posix()
            if rel in allowed or rel.startswith(("spec_zoo/train/", "spec_zoo/bench/")) or rel.endswith("/train.py"):
                continue
            offenders += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                          if pattern.search(line) and not line.lstrip().startswith("#")]
    assert not offenders, "random draws outside spec_zoo/sampling.py:\n" + "\n".join(offenders)


def test_the_branch_budget_says_what_to_shrink(model, draft):
    with pytest.raises(ConfigError, match=r"budget=50 .*shrink the length"):
        certify(lambda: model, small(draft, num_draft=2), RejectionVerifier(), T1, CERTIFY_PROMPT, 3, budget=50)


# -- the certification table ---------------------------------------------------------------

# every drafter, shape, verifier and setting at least once (the whole table: docs/certification_table.md)
CI_CELLS = [
    ("ngram", "chain", "rejection", "T=1"),
    ("ngram", "static", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("small_model", "chain", "block", "T=0.7 top-k 3 top-p 0.75"),
    ("small_model", "static", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("distilled", "chain", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("eagle", "multi_draft", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("eagle", "chain", "block", "T=1"),
    ("medusa", "dynamic", "rejection", "T=1"),
    ("medusa", "chain", "typical", "T=0.7 top-k 3 top-p 0.75"),
    ("hydra", "chain", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("hydra", "static", "rejection", "T=1"),
    ("mlp_speculator", "chain", "block", "T=0.7 top-k 3 top-p 0.75"),
    ("mlp_speculator", "multi_draft", "rejection", "T=1"),
    ("parallel", "chain", "block", "T=0.7 top-k 3 top-p 0.75"),
    ("parallel", "static", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("early_exit", "chain", "block", "T=0.7 top-k 3 top-p 0.75"),
    ("early_exit", "dynamic", "greedy", "T=0"),
    ("cascade", "chain", "block", "T=0.7 top-k 3 top-p 0.75"),
    ("merge", "chain", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("merge", "chain", "block", "T=1"),
    ("small_model", "chain", "greedy", "T=1"),
    ("cross_tokenizer", "chain", "rejection", "T=0.7 top-k 3 top-p 0.75"),
    ("quantized", "dynamic", "rejection", "T=0.7 top-k 3 top-p 0.75"),
]


def test_the_ci_cells_cover_the_table():
    cells = certify_table.cells()
    for axis in ("drafter", "shape", "verifier", "setting"):
        assert {getattr(c, axis) for c in cells} == {cell[["drafter", "shape", "verifier", "setting"].index(axis)]
                                                      for cell in CI_CELLS}, axis


def _table_rows() -> dict:
    rows = {}
    for line in certify_table.TABLE.read_text().splitlines():
        parts = [p.strip() for p in line.strip("|").split("|")]
        if len(parts) == 8 and parts[0] in certify_table.DRAFTERS:
            rows[tuple(parts[:4])] = parts[4:]
    return rows


def test_the_generated_table_is_complete_and_lossless():
    rows = _table_rows()
    assert list(rows) == [(c.drafter, c.shape, c.verifier, c.setting) for c in certify_table.cells()]
    for (drafter, shape, verifier, setting), (status, tv, _, _) in rows.items():
        if status == "refused":
            assert (verifier == "greedy" and setting != "T=0") or (verifier == "block" and shape != "chain") or \
                   (verifier == "block" and drafter == "merge") or (drafter == "ngram" and shape != "chain"), drafter
        elif verifier == "typical" and setting != "T=0":
            assert status == "lossy" and float(tv) > CAUGHT  # the lossy rule's exact distance
        else:
            assert status == "lossless" and float(tv) <= MAX_TV, (drafter, shape, verifier, setting)


@pytest.mark.parametrize("cell", CI_CELLS, ids="-".join)
def test_certification_table_cell(cell):
    """Certified now, and equal to the generated table's row (the docs are current). A lossless
    cell's TV is float64 rounding (~1e-16), whose digits depend on the CPU's kernels (AVX2 and
    AVX-512 differ), so only its bound is compared; a lossy cell's TV is a real distance."""
    result = certify_table.run(certify_table.Cell(*cell))
    status, tv, tau, decodes = _table_rows()[cell]
    assert result.status == status
    if result.status != "refused":
        assert (f"{result.tau:.4f}", str(result.branches)) == (tau, decodes)
        if result.status == "lossy":
            assert f"{result.tv:.1e}" == tv
        else:
            assert result.tv <= MAX_TV and float(tv) <= MAX_TV


# -- broken rules, each caught ------------------------------------------------------------


class SkipResidual(RejectionVerifier):
    """Rejection without the residual: a rejected token is replaced by a draw from p."""

    def verify(self, draft, target_logits, sampling, generator):
        verdict = super().verify(draft, target_logits, sampling, generator)
        if not verdict.bonus:
            row = verdict.path[-1] + 1 if verdict.path else 0
            verdict.next_token = int(sample(logits_to_probs(target_logits[row], sampling), generator))
        return verdict


class UnnormalisedResidual(RejectionVerifier):
    """The residual max(0, p - q) kept unnormalised before the next sibling is judged."""

    def verify(self, draft, target_logits, sampling, generator):
        p_rows, tokens, path, node = logits_to_probs(target_logits, sampling), draft.tokens.tolist(), [], ROOT
        while True:
            p, draws, accepted, tried = p_rows[node + 1], draft.draws_of(node), None, []
            for child in draws:
                q = proposal(draft, child, tried, p)
                if accept(p[tokens[child]], q[tokens[child]], generator):
                    accepted = child
                    break
                tried.append(tokens[child])
                residual = (p - q).clamp(min=0)
                p = residual if residual.sum() > 0 else p  # no division by its sum
            if accepted is None:
                return Verdict(path, int(sample(p, generator)), bonus=not draws)
            path.append(accepted)
            node = accepted


def _tokenwise_weights(p, q, tokens):
    h, _ = _block_weights(p, q, tokens)
    return h, (p[: len(tokens)] - q).clamp(min=0)


_block_weights = block.block_weights


class BlockWithoutCorrection(BlockVerifier):
    """Block verification with the token-wise residual max(p - q, 0) instead of the block
    residual max(p_i p - q, 0): the correction that makes the joint rule exact is gone."""

    def verify(self, draft, target_logits, sampling, generator):
        block.block_weights = _tokenwise_weights
        try:
            return super().verify(draft, target_logits, sampling, generator)
        finally:
            block.block_weights = _block_weights


class WithReplacementAsWithout(RejectionVerifier):
    """i.i.d. siblings (multi-draft, with replacement) verified as if drawn without replacement."""

    def verify(self, draft, target_logits, sampling, generator):
        if draft.siblings == "iid" and draft.draws is None:
            draft = dataclasses.replace(draft, siblings="without_replacement")
        return super().verify(draft, target_logits, sampling, generator)


class _Reversed(Draft):
    def draws_of(self, node):
        return list(reversed(super().draws_of(node)))


class SiblingsReversed(RejectionVerifier):
    """Visits siblings drawn without replacement last-drawn first."""

    def verify(self, draft, target_logits, sampling, generator):
        reordered = copy.copy(draft)
        reordered.__class__ = _Reversed
        return super().verify(reordered, target_logits, sampling, generator)


class TopPOnlyOnQ(RejectionVerifier):
    """The drafter's q is truncated by top-p, the verifier's p is not."""

    def verify(self, draft, target_logits, sampling, generator):
        return super().verify(draft, target_logits, dataclasses.replace(sampling, top_p=1.0), generator)


BROKEN = {  # rule, drafter's shape, setting
    "rejection_without_residual": (SkipResidual, {"num_draft": 2}, T07),
    # (at T=1 the second sibling's q covers the residual here, where normalising changes nothing)
    "residual_not_renormalised": (UnnormalisedResidual, {"tree": lambda: Static([[0], [1]])}, T07_P09),
    "block_without_correction": (BlockWithoutCorrection, {"num_draft": 2}, T07_P09),
    "with_replacement_as_without": (WithReplacementAsWithout, {"tree": lambda: MultiDraft(n=2, depth=1)}, T07_P09),
    "siblings_in_the_wrong_order": (SiblingsReversed, {"tree": lambda: Static([[0], [1]])}, T07),
    "top_p_on_q_only": (TopPOnlyOnQ, {"num_draft": 2}, T07),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_rules_are_caught(model, draft, name):
    rule, shape, sampling = BROKEN[name]
    kw = {k: v() if callable(v) else v for k, v in shape.items()}
    with pytest.raises(AssertionError, match="exact total variation") as failed:
        assert_lossless(lambda m: SmallModelDrafter(draft, adaptive=False, **kw), rule(), sampling, model)
    tv = float(re.search(r"variation ([0-9.e+-]+)", str(failed.value)).group(1))
    assert tv >= CAUGHT, tv
    assert_lossless(lambda m: SmallModelDrafter(draft, adaptive=False, **kw), rule.__mro__[1](), sampling, model)


# -- exact expectations ---------------------------------------------------------------------


def constant_model(probs: list[float]):
    """A Llama whose next-token distribution is ``probs`` after every context: equal
    embeddings, attention and MLP outputs zeroed, the LM head reading the constant state."""
    model = tiny_llama(0, vocab=len(probs))
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.ones_like(model.model.embed_tokens.weight))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        state = model.model.norm(model.model.embed_tokens.weight[:1])[0]
        model.lm_head.weight.copy_(torch.tensor(probs, dtype=torch.float64).log()[:, None] * state / state.dot(state))
    return model


def test_the_paper_example_exactly():
    """Sun et al. (block verification), Section 1: target (1/3, 2/3), draft (2/3, 1/3) over
    {a, b} in every context, blocks of 2: token-wise rejection accepts 10/9 draft tokens per
    step, block verification 11/9: here as the first step's expected commit, 1 + accepted."""
    target, draft = constant_model([1 / 3, 2 / 3]), constant_model([2 / 3, 1 / 3])
    got = {}
    for verifier in (RejectionVerifier(), BlockVerifier()):
        cert = certify(lambda: target, small(draft, num_draft=2, sample=True), verifier, T1, [0, 1], 3)
        assert cert.tv <= MAX_TV
        got[verifier.name] = cert.first_step - 1
    assert got["rejection"] == pytest.approx(10 / 9, abs=1e-12)
    assert got["block"] == pytest.approx(11 / 9, abs=1e-12)


@pytest.mark.parametrize("seed", [3, 4])
def test_block_is_never_worse_than_rejection(seed):
    """On random tiny models with a sampled draft: the same first draft, block keeps at least
    as many tokens in expectation, and both are exact."""
    target = tiny_llama(seed, vocab=4, sharpness=4.0)
    draft = noisy_copy(target, 1.5, seed=seed)
    first = {}
    for verifier in (RejectionVerifier(), BlockVerifier()):
        cert = certify(lambda: target, small(draft, num_draft=2, sample=True), verifier, T07, CERTIFY_PROMPT, 3)
        assert cert.tv <= MAX_TV
        first[verifier.name] = cert.first_step
    assert first["block"] >= first["rejection"] - 1e-12
    assert math.isfinite(first["block"])


def test_spec_zoo_list_quotes_the_lossy_rules_certified_tv():
    """`spec-zoo list` shows typical acceptance's exact TV range, as the generated table has it."""
    from spec_zoo.registry import format_options, options

    tvs = sorted(float(tv) for (_, _, verifier, _), (status, tv, _, _) in _table_rows().items()
                 if verifier == "typical" and status == "lossy")
    line = next(row for row in format_options(options()).splitlines() if row.strip().startswith("typical"))
    assert f"exact TV {tvs[0]:.1e} to {tvs[-1]:.1e}" in line and "LOSSY" in line


def test_the_quantized_draft_is_certified_and_a_broken_rule_with_it_is_caught(model):
    """The target's own 4-bit copy (`drafter=quantized`) drafts what the target nearly always keeps,
    which leaves a broken rule little room: the certificate still passes the exact rule and fails one
    without the residual."""
    from spec_zoo.drafters.quantized import QuantizedDrafter

    def quantized(m):
        return QuantizedDrafter(num_draft=2, adaptive=False, runtime="eager")

    assert_lossless(quantized, RejectionVerifier(), T07, model)
    with pytest.raises(AssertionError, match="exact total variation") as failed:
        assert_lossless(quantized, SkipResidual(), T07, model)
    assert float(re.search(r"variation ([0-9.e+-]+)", str(failed.value)).group(1)) >= CAUGHT
