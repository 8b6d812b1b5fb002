"""verifier=block (block verification, Sun et al., ICLR 2025): lossless with every chain
drafter (enumerated exactly, as in test_sampling_exact.py, and a broken variant that fails
it), greedy at temperature 0, the paper's worked example (10/9 vs 11/9 accepted tokens)
and "never worse than rejection" computed exactly by enumeration, trees refused."""

import itertools
import math

import pytest
import torch

from spec_zoo import Draft, Drafter, SamplingParams, SpeculativeDecoder, Target, logits_to_probs
from spec_zoo.api import compose_config
from spec_zoo.errors import ConfigError
from spec_zoo.registry import build_component
from spec_zoo.sampling import sample
from spec_zoo.testing import CERTIFY_SETTINGS, assert_greedy_identity, assert_lossless, certify_model
from spec_zoo.verifiers.block import BlockVerifier, block_weights
from tests.drafts import drafter_lineup
from tests.test_greedy_identity import SEEDS
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)

# every drafter of the line-up whose drafts are chains (merges draft trees)
CHAIN_DRAFTERS = [name for name in drafter_lineup(tiny_llama(0))
                  if not name.startswith(("none", "merge")) and "tree" not in name]

# -- lossless: enumerated (spec_zoo.testing.assert_lossless) -------------------------------

SAMPLED_CASES = [
    ("ngram_k4_adaptive", "t1"),
    ("small_chain_k3", "t1"),
    ("small_chain_adaptive", "t0.7_topk3_topp0.75"),
    ("early_exit_k3", "t0.7_topk3_topp0.75"),
    ("early_exit_adapter_no_reuse", "t0.7_topk3_topp0.75"),
    ("eagle_k3", "t1"),
    ("eagle_adaptive", "t0.7_topk3_topp0.75"),
]
# ngram_k4_adaptive above is deterministic too (probs=None); these add a reduced draft vocabulary
DETERMINISTIC_CASES = ["early_exit_adapter", "eagle_k3"]


@pytest.fixture(scope="module")
def model():
    return certify_model()


@pytest.mark.parametrize("drafter,setting", SAMPLED_CASES)
def test_block_sampled_drafts_follow_target(model, drafter, setting):
    assert_lossless(lambda m: drafter_lineup(m, sampled=True)[drafter](), BlockVerifier(), CERTIFY_SETTINGS[setting],
                    model)


@pytest.mark.parametrize("drafter", DETERMINISTIC_CASES)
def test_block_deterministic_drafts_follow_target(model, drafter):
    """Greedy drafts (q one-hot, ``probs=None``) verified at temperature 1."""
    assert_lossless(lambda m: drafter_lineup(m, sampled=False)[drafter](), BlockVerifier(), model=model)


class BlockSkipResidual(BlockVerifier):
    """A broken rule: the block ratio decides the length, but the recovered token is
    drawn from p instead of the block residual norm(max(p_tau * p - q, 0))."""

    def verify(self, draft, target_logits, sampling, generator):
        verdict = super().verify(draft, target_logits, sampling, generator)
        if not verdict.bonus:
            probs = logits_to_probs(target_logits[len(verdict.path)], sampling)
            verdict.next_token = int(sample(probs, generator))
        return verdict


def test_broken_block_rule_fails(model):
    with pytest.raises(AssertionError, match="exact total variation"):  # the check the correct rule passes
        assert_lossless(lambda m: drafter_lineup(m, sampled=True)["small_chain_k3"](), BlockSkipResidual(),
                        CERTIFY_SETTINGS["t0.7_topk3_topp0.75"], model)


# -- temperature 0: greedy ------------------------------------------------------------


@pytest.mark.parametrize("drafter", CHAIN_DRAFTERS)
def test_block_matches_plain_greedy(drafter):
    assert_greedy_identity(lambda model: drafter_lineup(model)[drafter](), SEEDS, verifiers=[BlockVerifier()])


# -- exact expectations by enumeration ---------------------------------------------------


def expected_accepted(p_of, q_of, vocab: int, gamma: int, rule=block_weights) -> dict:
    """Expected accepted draft tokens per step of `rejection` and `block`, in closed form.

    p_of(prefix) / q_of(prefix) give the target / draft distribution [vocab] after a tuple
    of block tokens. Every block x in vocab^gamma is weighted by q(x); rejection keeps x^i
    with prob prod_{j<=i} min(1, p/q); block keeps exactly i tokens with prob
    h_i * prod_{j>i} (1 - h_j) (h from ``rule``: the verifier's own `block_weights`). Also
    returns `block`'s one-step output law: {committed tokens: probability}."""
    rejection = block_total = 0.0
    committed: dict[tuple, float] = {}
    for x in itertools.product(range(vocab), repeat=gamma):
        p = torch.stack([p_of(x[:i]) for i in range(gamma + 1)])
        q = torch.stack([q_of(x[:i]) for i in range(gamma)])
        weight = float(torch.prod(q[torch.arange(gamma), list(x)]))
        if weight == 0:
            continue
        keep = 1.0
        for i in range(gamma):
            keep *= min(1.0, float(p[i, x[i]] / q[i, x[i]]))
            rejection += weight * keep
        h, residual = rule(p, q, torch.tensor(x))
        rest = 1.0  # P(no longer prefix kept)
        for i in range(gamma, -1, -1):
            stop = rest * float(h[i])
            rest -= stop
            block_total += weight * stop * i
            nxt = p[gamma] if i == gamma else residual[i] / residual[i].sum() if stop > 0 else p[i]
            for y in range(vocab):
                key = x[:i] + (y,)
                committed[key] = committed.get(key, 0.0) + weight * stop * float(nxt[y])
    return {"rejection": rejection, "block": block_total, "committed": committed}


def _constant(probs):
    probs = torch.tensor(probs, dtype=torch.float64)
    return lambda prefix: probs


def test_paper_motivating_example():
    """Sun et al., Section 1: context-independent target (1/3, 2/3) and draft (2/3, 1/3) over
    {a, b}, blocks of 2: token-wise verification keeps 10/9 tokens per step, block 11/9."""
    got = expected_accepted(_constant([1 / 3, 2 / 3]), _constant([2 / 3, 1 / 3]), vocab=2, gamma=2)
    assert got["rejection"] == pytest.approx(10 / 9, abs=1e-12)
    assert got["block"] == pytest.approx(11 / 9, abs=1e-12)


def _random_model(gen: torch.Generator, vocab: int, one_hot: bool = False):
    """A context-dependent random distribution (some zeros), fixed per prefix once drawn."""
    table: dict[tuple, torch.Tensor] = {}

    def of(prefix):
        if prefix not in table:
            w = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 3
            w = w * (torch.rand(vocab, generator=gen, dtype=torch.float64) > 0.25)
            w[int(torch.randint(vocab, (), generator=gen))] += 0.01  # never all zero
            if one_hot:
                w = torch.nn.functional.one_hot(w.argmax(), vocab).double()
            table[prefix] = w / w.sum()
        return table[prefix]

    return of


def _chain_law(p_of, vocab: int, length: int) -> dict:
    """{z: p(z)} for every z in vocab^length."""
    return {z: math.prod(float(p_of(z[:i])[z[i]]) for i in range(length))
            for z in itertools.product(range(vocab), repeat=length)}


def _random_cases(count: int = 50):
    """(vocab, gamma, p_of, q_of): vocab 2-4, block length 2-4, context-dependent p and q,
    every fifth q deterministic (one-hot)."""
    gen = torch.Generator().manual_seed(0)
    for case in range(count):
        vocab, gamma = 2 + case % 3, 2 + (case // 3) % 3
        yield vocab, gamma, _random_model(gen, vocab), _random_model(gen, vocab, one_hot=case % 5 == 0)


def _law_error(p_of, vocab: int, gamma: int, committed: dict) -> float:
    """Largest gap between the law of the first gamma + 1 tokens (one step's output,
    continued by the target) and the target's own law."""
    law = dict.fromkeys(itertools.product(range(vocab), repeat=gamma + 1), 0.0)
    for prefix, mass in committed.items():
        for rest, prob in _chain_law(lambda s, prefix=prefix: p_of(prefix + s), vocab, gamma + 1 - len(prefix)).items():
            law[prefix + rest] += mass * prob
    return max(abs(law[z] - prob) for z, prob in _chain_law(p_of, vocab, gamma + 1).items())


def test_block_never_worse_than_rejection_and_exact():
    """On 50 random cases block keeps at least as many tokens as rejection in expectation,
    and its one-step output, continued by the target, has exactly the target's law."""
    gains = []
    for case, (vocab, gamma, p_of, q_of) in enumerate(_random_cases()):
        got = expected_accepted(p_of, q_of, vocab, gamma)
        assert got["block"] >= got["rejection"] - 1e-12, case
        assert _law_error(p_of, vocab, gamma, got["committed"]) < 1e-12, case
        gains.append(got["block"] - got["rejection"])
    assert max(gains) > 0.1  # the cases are informative: block often gains


def test_tokenwise_residual_breaks_exactness():
    """Block acceptance with the token-wise residual max(p - q, 0) (a plausible slip) is not
    exact: the enumeration catches it (too subtle for the chi-square line-up's budget)."""
    def tokenwise(p, q, tokens):
        h, _ = block_weights(p, q, tokens)
        return h, (p[: len(tokens)] - q).clamp(min=0)

    errors = [_law_error(p_of, vocab, gamma, expected_accepted(p_of, q_of, vocab, gamma, tokenwise)["committed"])
              for vocab, gamma, p_of, q_of in _random_cases(10)]
    assert max(errors) > 0.01


# -- trees are refused; configs ----------------------------------------------------------


def test_trees_are_refused():
    model = tiny_llama(0)
    lineup = drafter_lineup(model)
    for tree_drafter in ("small_tree_2x3", "merge_ngram_small"):
        with pytest.raises(ConfigError, match=r"verifier=block verifies chains only.*use verifier=rejection"):
            SpeculativeDecoder(Target(model), lineup[tree_drafter](), BlockVerifier(), SamplingParams())  # up front
    BlockVerifier().check_drafter(lineup["small_chain_k3"]())

    class UndeclaredTrees(Drafter):  # a custom drafter that branches without saying so
        def propose(self, state):
            return Draft(torch.tensor([3, 4]), [-1, -1])

    decoder = SpeculativeDecoder(Target(model), UndeclaredTrees(), BlockVerifier(), SamplingParams())
    with pytest.raises(ConfigError, match=r"verifier=block verifies chains only.*use verifier=rejection"):
        decoder.generate([3, 4, 5], max_new_tokens=8, eos_token_ids=[])


def test_config_builds_block_verifier():
    verifier = build_component(compose_config(["verifier=block"]).verifier, "verifier")
    assert isinstance(verifier, BlockVerifier) and verifier.lossless
