"""Token trees as a policy (spec_zoo/trees.py) and exact multi-draft rejection
(verifiers/rejection.py): siblings drawn i.i.d. (multi-draft, repeated draws replayed),
without replacement (top-k / static trees when sampling), or deterministically.

Exactness enumerated as in tests/test_sampling_exact.py (`assert_lossless`: the exact law
of three generated tokens on a 4-token model against the target's); broken rules must fail
the same check."""

import dataclasses
import functools

import pytest
import torch

from spec_zoo import SamplingParams
from spec_zoo.certify import explore, total_variation
from spec_zoo.costs import CostTable
from spec_zoo.draft import ROOT, Draft
from spec_zoo.drafters.eagle.drafter import EagleDrafter
from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
from spec_zoo.drafters.merge import MergeDrafter
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Verdict
from spec_zoo.lockstep import answer, drive
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import accept, logits_to_probs, sample
from spec_zoo.testing import CERTIFY_SETTINGS, SETTINGS, assert_greedy_identity, assert_lossless, certify_model
from spec_zoo.trees import (
    Auto,
    Chain,
    DraftTreeForward,
    Dynamic,
    MultiDraft,
    Static,
    TopK,
    build_tree_policy,
    tree_cost,
    tree_so_far,
    tree_value,
)
from spec_zoo.verifiers.block import BlockVerifier
from spec_zoo.verifiers.rejection import RejectionVerifier
from tests.drafts import eagle_head, exit_adapter, noisy_copy
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)

POLICIES = {
    "chain": lambda: Chain(3),
    "topk": lambda: TopK(2, 3),
    "static": lambda: Static([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    "dynamic": lambda: Dynamic(width=3, depth=4, budget=8),
    "multi_draft": lambda: MultiDraft(n=3, depth=3),
    "auto": lambda: Auto(max_nodes=8, max_depth=4, max_width=3),
}


T1, T07 = CERTIFY_SETTINGS["t1"], CERTIFY_SETTINGS["t0.7_topk3_topp0.75"]


@pytest.fixture(scope="module")
def model():
    return certify_model()


@functools.cache
def _noisy(model, noise):
    return noisy_copy(model, noise)


def small(model, policy, sample="auto", noise=1.0):
    """A small-model drafter over a noisy copy of ``model`` (one copy per noise level)."""
    return SmallModelDrafter(_noisy(model, noise), tree=policy, sample=sample)


# -- exact sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["static", "multi_draft", "dynamic", "auto"])
def test_sampled_trees_follow_target(model, policy):
    """static/auto: siblings without replacement; multi_draft: i.i.d. with repeats replayed;
    dynamic: deterministic (q one-hot) even when the run samples. (topk is the line-up's
    small_tree_2x3 in tests/test_sampling_exact.py, sampled and greedy-drafted; the one-node
    tests below carry the power against broken rules.) T=1 for the deterministic tree, T=0.7
    with top-k and top-p where sampled siblings make the choice tree large."""
    tree = (lambda: MultiDraft(n=2, depth=2)) if policy == "multi_draft" else POLICIES[policy]  # 3 x 3: 10^4 decodes
    assert_lossless(lambda m: small(model, tree()), sampling=T1 if policy == "dynamic" else T07, model=model)


class PerBranch(RejectionVerifier):
    """A naive tree rule: every sibling is judged against the same p (no residual between
    siblings), as if each branch were a chain of its own."""

    def verify(self, draft, target_logits, sampling, generator):
        p_rows = logits_to_probs(target_logits, sampling)
        path, node = [], ROOT
        while True:
            p, kids = p_rows[node + 1], draft.children(node)
            for child in kids:
                q = draft.probs[child].to(p)
                x = int(draft.tokens[child])
                if accept(p[x], q[x], generator):
                    path.append(child)
                    node = child
                    break
            else:
                residual = (p - q).clamp(min=0) if kids else p
                return Verdict(path, int(sample(residual / residual.sum(), generator)), bonus=not kids)


class AsIfIid(RejectionVerifier):
    """Treats siblings drawn without replacement as i.i.d. draws (q not renormalised)."""

    def verify(self, draft, target_logits, sampling, generator):
        if draft.siblings == "without_replacement":
            draft = dataclasses.replace(draft, siblings="iid")
        return super().verify(draft, target_logits, sampling, generator)


class WithoutReplay(RejectionVerifier):
    """Drops the replay of repeated i.i.d. draws (a merged token tried once)."""

    def verify(self, draft, target_logits, sampling, generator):
        return super().verify(dataclasses.replace(draft, draws=None), target_logits, sampling, generator)


def test_naive_per_branch_rule_fails(model):
    """The model-level check catches the naive rule (a far draft: frequent rejections)."""
    with pytest.raises(AssertionError, match="exact total variation"):
        assert_lossless(lambda m: small(model, MultiDraft(n=2, depth=1), noise=2.0), PerBranch(), T1, model)


# one node, enumerated: the law of the first committed token against p, for a p and q far apart
P_NODE = torch.tensor([0.40, 0.05, 0.05, 0.30, 0.10, 0.10], dtype=torch.float64)
Q_NODE = torch.tensor([0.05, 0.60, 0.20, 0.05, 0.05, 0.05], dtype=torch.float64)


@pytest.mark.parametrize("rule,policy,exact", [
    (RejectionVerifier, MultiDraft(n=3, depth=1), True),
    (RejectionVerifier, TopK(3, 1), True),
    (PerBranch, MultiDraft(n=3, depth=1), False),
    (WithoutReplay, MultiDraft(n=3, depth=1), False),
    (AsIfIid, TopK(3, 1), False),
])
def test_one_node_rules(rule, policy, exact):
    """Repeated i.i.d. draws must be replayed and draws without replacement renormalised:
    dropping either (or judging every branch against the same p) biases the token."""
    state = _state(temperature=1.0)
    logits = torch.stack([P_NODE.log()] * 5)  # rows after nodes: unused at depth 1

    def first_token():
        draft = policy.build(Fixed(Q_NODE.log()), state, sampled=True)
        verdict = rule().verify(draft, logits[: len(draft) + 1], SETTINGS["t1"], state.generator)
        return int(draft.tokens[verdict.path[0]]) if verdict.path else verdict.next_token

    law: dict = {}
    for token, prob in explore(first_token):
        law[token] = law.get(token, 0.0) + prob
    tv = total_variation(law, dict(enumerate(P_NODE.tolist())))
    assert tv <= 1e-9 if exact else tv >= 1e-3


def test_multi_draft_replays_repeated_draws(model):
    """A merged token drawn k times is listed k times in Draft.draws, in draw order."""
    drafter = small(model, MultiDraft(n=6, depth=2), noise=0.5)
    drafter.attach(Target(model))
    drafter.begin(None)
    state = DecodeState([2, 3, 0, 2], 4, 8, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    draft = drafter.propose(state)
    assert draft.siblings == "iid" and draft.draws is not None
    assert sum(len(order) for order in draft.draws.values()) == 6 * 2  # every draw of every chain
    assert len(draft) < 6 * 2  # merged
    for parent, order in draft.draws.items():
        assert set(order) == set(draft.children(parent))
        assert torch.equal(draft.probs[order[0]], draft.probs[order[-1]])  # one q per parent


def test_draft_refuses_inconsistent_sibling_modes():
    with pytest.raises(ValueError, match="siblings"):
        Draft(torch.tensor([1, 2]), [-1, -1], siblings="without_replacement")
    with pytest.raises(ValueError, match="children"):
        Draft(torch.tensor([1, 2]), [-1, -1], torch.ones(2, 4) / 4, draws={ROOT: [0, 0]})
    cut = Draft(torch.tensor([1, 2, 3]), [-1, -1, 0], torch.ones(3, 4) / 4, draws={ROOT: [0, 1, 0], 0: [2]})
    assert cut.truncated(1).draws == {ROOT: [0, 1, 0]}


class OldRule(RejectionVerifier):
    """A verifier written for i.i.d. and deterministic siblings only (the default declaration)."""

    sibling_modes = ("iid", "deterministic")


def test_verifiers_refuse_sibling_modes_up_front(model):
    with pytest.raises(ConfigError, match="without_replacement"):
        OldRule().check_drafter(small(model, TopK(2, 2)))
    OldRule().check_drafter(small(model, MultiDraft(2, 2)))
    OldRule().check_drafter(MergeDrafter([small(model, MultiDraft(2, 2)), NgramDrafter()]))
    BlockVerifier().check_drafter(small(model, Chain(3)))  # a chain policy is a chain drafter


def test_merged_without_replacement_siblings_stay_exact(model):
    """merge: a member's siblings drawn without replacement become rows of what each was drawn from."""
    assert_lossless(lambda m: MergeDrafter([small(model, TopK(2, 1), noise=0.5),
                                            small(model, MultiDraft(2, 1), noise=0.5)]),
                    sampling=T07, model=model)


# -- greedy identity and deterministic trees ---------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_greedy_identity_small_model(policy):
    assert_greedy_identity(lambda target: SmallModelDrafter(noisy_copy(target, 1.0), tree=POLICIES[policy]()),
                           seeds=(0, 1))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_greedy_identity_eagle(policy):
    """EAGLE heads draft trees level by level from their guessed features (tree mask over the head's cache)."""
    assert_greedy_identity(lambda target: EagleDrafter(eagle_head(target), tree=POLICIES[policy]()), seeds=(0, 1))


@pytest.mark.parametrize("policy", ["topk", "multi_draft"])
def test_sampled_eagle_trees_follow_target(model, policy):
    head = eagle_head(model)
    assert_lossless(lambda m: EagleDrafter(head, tree=POLICIES[policy]()), sampling=T07, model=model)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_greedy_identity_early_exit(policy):
    """Early exit drafts trees in its own shallow cache (and the adapter's), one forward per level."""
    assert_greedy_identity(lambda target: EarlyExitDrafter(
        1, reuse_kv=False, adapter=exit_adapter(target) if policy in ("topk", "auto") else None,
        tree=POLICIES[policy]()), seeds=(0, 1))


def test_sampled_early_exit_tree_follows_target(model):
    adapter = exit_adapter(model)
    assert_lossless(lambda m: EarlyExitDrafter(1, reuse_kv=False, adapter=adapter, tree=TopK(2, 3)), sampling=T07,
                    model=model)


def test_early_exit_tree_needs_its_own_cache():
    with pytest.raises(ConfigError, match="reuse_kv=false"):
        EarlyExitDrafter(1, tree="topk")


@pytest.mark.parametrize("ngram", ["tree", "tree_budget2"])
def test_greedy_identity_ngram_trees(ngram):
    budget = 12 if ngram == "tree" else 2
    assert_greedy_identity(lambda target: NgramDrafter(num_draft=4, adaptive=False, branches=3, max_nodes=budget))


def test_ngram_tree_branches_on_distinct_continuations():
    drafter = NgramDrafter(num_draft=3, min_ngram=1, max_ngram=1, adaptive=False, branches=3, max_nodes=5)
    tokens = [5, 1, 2, 5, 3, 4, 5, 1, 7, 5]  # after 5: 1 (latest: 1 7 5), 3 (3 4 5)
    drafter.begin(None)
    draft = drafter.propose(DecodeState(tokens, 2, 8, SamplingParams(), torch.Generator()))
    assert draft.tokens.tolist() == [1, 7, 5, 3, 4] and draft.parents == [-1, 0, 1, -1, 3]  # 5 nodes
    assert draft.siblings == "deterministic" and drafter.drafts_trees
    frequent = NgramDrafter(num_draft=2, min_ngram=1, max_ngram=1, adaptive=False, branches=2, order="frequent")
    frequent.begin(None)
    tokens = [5, 3, 4, 5, 3, 6, 5, 1, 7, 5]  # after 5: 3 twice, then 1 (the latest)
    draft = frequent.propose(DecodeState(tokens, 2, 8, SamplingParams(), torch.Generator()))
    assert draft.tokens.tolist() == [3, 6, 1, 7] and draft.parents == [-1, 0, -1, 2]


def test_ngram_tree_follows_target(model):
    """Distinct deterministic siblings: rejection stays exact (q one-hot per sibling)."""
    assert_lossless(lambda m: NgramDrafter(num_draft=3, adaptive=False, branches=3), model=model)


# -- tree shapes and the level-by-level forward -----------------------------------------------


class Fixed:
    """An ``expand`` returning the same logits after every node."""

    def __init__(self, logits):
        self.logits, self.calls = logits, []

    def __call__(self, tree, nodes):
        self.calls.append(list(nodes))
        return self.logits.expand(len(nodes), -1)


def _state(depth=8, temperature=0.0):
    return DecodeState([1, 2], 2, depth, SamplingParams(temperature=temperature), torch.Generator().manual_seed(0))


def test_policy_shapes():
    logits = torch.tensor([0.0, 3.0, 2.0, 1.0, -1.0])
    tree = TopK(2, 3).build(Fixed(logits), _state(), sampled=False)
    assert len(tree) == 2 + 4 + 8 and tree.siblings == "deterministic"
    assert tree.tokens[tree.children(ROOT)].tolist() == [1, 2]
    static = Static([[0], [1], [0, 0]]).build(Fixed(logits), _state(), sampled=False)
    assert static.parents == [-1, -1, 0] and static.tokens.tolist() == [1, 2, 1]
    assert len(Chain(5).build(Fixed(logits), _state(depth=3), sampled=False)) == 3  # the budget cut
    expand = Fixed(logits)
    dynamic = Dynamic(width=2, depth=3, budget=5).build(expand, _state(), sampled=False)
    assert len(dynamic) == 5 and expand.calls[0] == [ROOT] and all(len(c) <= 2 for c in expand.calls)
    scores = {(): 0.0}
    for i in range(len(dynamic)):  # kept nodes: ancestors first, the most probable paths
        path = tuple(dynamic.tokens[dynamic.path_to(i)].tolist())
        scores[path] = scores[path[:-1]] + float(logits.log_softmax(-1)[path[-1]])
    assert min(scores.values()) >= float(logits.log_softmax(-1)[1] * 2 + logits.log_softmax(-1)[2])
    sampled = MultiDraft(n=4, depth=3).build(Fixed(logits), _state(temperature=1.0), sampled=True)
    assert sampled.depth == 3 and len(sampled.leaves()) <= 4


def test_static_choices_are_checked():
    with pytest.raises(ConfigError, match=r"needs \[0\]"):
        Static([[1], [0, 0]])
    with pytest.raises(ConfigError, match="drafter.tree"):
        build_tree_policy({"policy": "topk", "wdth": 3})
    with pytest.raises(ConfigError, match="tree policy"):
        SmallModelDrafter(tiny_llama(0), tree="bushy")
    assert isinstance(build_tree_policy({"policy": "dynamic", "budget": 4}), Dynamic)


def test_a_tree_at_the_top_level_names_drafter_tree():
    """`spec-zoo tree=topk`: the policy is a drafter's key; the one-line error says so."""
    from spec_zoo.schema import check_command_line

    for config in ("config", "bench"):
        with pytest.raises(ConfigError, match=r"^tree: .*drafter\.tree=topk"):
            check_command_line(config, ["tree=topk"])


def assert_tree_forward_matches_paths(runner, model, committed, policy, atol=1e-5):
    """A draft model's tree expansion (`DraftTreeForward` on an eager runner, `tree_so_far` on a
    compiled one): each node's logits (one forward per level) equal a plain forward of the committed
    tokens + the path to that node; the next score crops the tree's KV away."""
    seen: dict = {}
    if runner.runtime == "eager":
        expand = DraftTreeForward(runner, committed, lambda x: x)
    else:
        asks = tree_so_far(runner, runner.sequence(), committed, lambda x: x)

        def expand(tree, nodes):
            return drive(asks((tree, nodes)), answer)

    def recording(tree, nodes):
        out = expand(tree, nodes)
        seen.update({node: (tree, row) for node, row in zip(nodes, out)})
        return out

    policy.build(recording, _state(), sampled=False)
    assert len(seen) >= 4  # the root and at least three expanded nodes
    for node, (tree, row) in seen.items():
        path = [] if node == ROOT else tree.tokens[tree.path_to(node)].tolist()
        with torch.no_grad():
            ref = model(torch.tensor([committed + path])).logits[0, -1]
        torch.testing.assert_close(row, ref, atol=atol, rtol=atol)
    after = runner.score(committed + [4], Draft.empty()).logits[-1]
    with torch.no_grad():
        torch.testing.assert_close(after, model(torch.tensor([committed + [4]])).logits[0, -1], atol=atol, rtol=atol)


@pytest.mark.parametrize("shape", ["deep", "wide"])
def test_tree_forward_equals_per_path_scoring(shape):
    """A tree mask over the draft cache, one forward per level (eager draft runner)."""
    model = tiny_llama(3, dtype=torch.float32)
    runner, committed = Target(model), [3, 7, 9, 2, 5]
    runner.score(committed[:3], Draft.empty())  # a cache already holding a prefix
    policy = TopK(4, 2) if shape == "wide" else Static([[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]])
    assert_tree_forward_matches_paths(runner, model, committed, policy)
    assert runner.cache.get_seq_length() == len(committed) + 1


# -- tree size from the cost model ------------------------------------------------------------


class Table:
    """A cost table t(M) / t(1) as `spec_zoo.costs.CostTable.relative` gives it."""

    def __init__(self, relative):
        self.relative = relative

    def draft_cost(self, key, default):  # no drafter's cost measured
        return default


TABLES = {
    "cpu_steps": Table(lambda m: 1.0 if m <= 4 else 1.7 if m <= 6 else 1.0 + 0.25 * m),  # flat to 4, then jumps
    "gpu_flat": Table(lambda m: 1.0 + 0.005 * m),
    "steep": Table(lambda m: 1.0 + 0.6 * (m - 1)),
}


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("seen,tried", [([6.0, 2.0, 1.0, 0.5], 10.0), ([1.0, 0.5, 0.0, 0.0], 10.0),
                                        ([9.5, 0.2, 0.1, 0.0], 10.0), ([2.0, 4.0, 1.0, 0.0], 10.0)])
def test_auto_never_predicts_worse_than_a_fixed_tree(table, seen, tried):
    auto = Auto(max_nodes=16, max_depth=6, max_width=4, draft_cost=0.05)
    auto.stats.seen, auto.stats.tried = seen, [tried] * 4
    acc = auto.acceptance()
    paths, (tokens, cost) = auto.plan(acc, TABLES[table], depth=8)
    predicted = tokens / cost
    fixed = [TopK(w, d).paths for w in range(1, 5) for d in range(1, 7) if len(TopK(w, d).paths) <= 16]
    fixed += [POLICIES["static"]().paths, []]

    def speed(p):
        return tree_value(p, acc) / tree_cost(p, auto.draft_cost, TABLES[table].relative)

    assert predicted >= max(map(speed, fixed)) - 1e-12
    assert predicted == pytest.approx(speed(paths))
    Static(paths or [[0]])  # a valid static tree


def test_auto_sizes_the_tree_by_the_machine():
    """The same acceptance: a flat cost curve buys a big tree, a steep one a small tree."""
    sizes = {}
    for name in ("gpu_flat", "steep"):
        auto = Auto(max_nodes=16, max_depth=6)
        auto.stats.seen, auto.stats.tried = [6.0, 2.0, 1.0, 0.5], [10.0] * 4
        sizes[name] = len(auto.plan(auto.acceptance(), TABLES[name], depth=8)[0])
    assert sizes["gpu_flat"] >= 12 and sizes["steep"] <= 4


def test_auto_prices_drafting_at_the_drafters_measured_cost():
    """A cost per tree level measured into the table for the drafter (``cost_key``) replaces
    the configured ``draft_cost``: dear drafting buys a shallower tree; without an entry for
    this drafter the configured cost holds."""
    depth = {}
    for name, drafts in (("cheap", {"eagle-compiled-tree": 0.01}), ("dear", {"eagle-compiled-tree": 0.6}),
                         ("other", {"medusa-tree": 0.6})):
        auto = Auto(max_nodes=16, max_depth=6, draft_cost=0.01)
        auto.cost_key = "eagle-compiled-tree"
        auto.stats.seen, auto.stats.tried = [8.0, 1.0, 0.5, 0.2], [10.0] * 4
        table = CostTable([1.0] * 16, "m", "compiled", "float32", 1, "x", drafts=drafts)
        depth[name] = max(map(len, auto.plan(auto.acceptance(), table, depth=8)[0]))
    assert depth["dear"] < depth["cheap"] == depth["other"]


def test_auto_learns_acceptance_per_rank():
    tree = Draft(torch.tensor([1, 2, 3]), [-1, -1, 0])  # ranks 0 and 1 under the root; 0 under node 0
    prior = Auto(max_width=2).acceptance()
    learnt = {}
    for name, verdict in [("deep", Verdict([0, 2], 9, bonus=True)), ("none", Verdict([], 9, bonus=False))]:
        auto = Auto(max_nodes=6, max_depth=3, max_width=2)
        for _ in range(20):
            auto.observe(tree, verdict)
        learnt[name] = auto.acceptance()
    assert learnt["deep"][0] > 0.9 > prior[0] and learnt["none"][0] < 0.1 and learnt["none"][1] < prior[1]
    auto = Auto(max_nodes=6, max_depth=3, max_width=2)
    auto.stats.seen, auto.stats.tried = [0.0, 0.0], [50.0, 50.0]  # drafts kept failing: auto drafts nothing now ...
    assert auto.plan(auto.acceptance(), None, depth=3)[0] == []
    for _ in range(100):  # ... and steps without a draft let that evidence fade, so it tries again
        auto.observe(Draft.empty(), Verdict([], 9, bonus=True))
    assert auto.plan(auto.acceptance(), None, depth=3)[0]


# -- the target: tree masks, positions and commits on both runtimes ---------------------------

_DEEP = [-1, 0, 1, 2, 3, 4, 5, 6, 0, 1, 8, 2]  # a chain of 8 with side branches at depths 1-3
_WIDE = [-1] * 10 + [4, 4]  # ten first-level nodes, two under the fifth
TARGET_CASES = {  # tree, accepted path
    "deep_leaf": (Draft(torch.arange(20, 32), _DEEP), [0, 1, 2, 3, 4, 5, 6, 7]),
    "deep_side": (Draft(torch.arange(20, 32), _DEEP), [0, 8, 10]),  # not a prefix of the node order
    "wide": (Draft(torch.arange(30, 42), _WIDE), [4, 11]),
    "inner_node": (Draft(torch.arange(20, 32), _DEEP), [0, 1, 2]),  # stops where children were rejected
}


@pytest.mark.parametrize("runtime", ["eager", "compiled"])
def test_tree_scores_and_commits_equal_per_path_forwards(runtime):
    """Every node's logits equal a plain forward of its path; after committing a path, the
    cache scores the next token as a fresh forward of the committed sequence does."""
    from spec_zoo.runtime import CompiledTarget

    model = tiny_llama(3, dtype=torch.float32)
    target = Target(model) if runtime == "eager" else CompiledTarget(model, max_cache_len=128, fallback=False)
    committed = [3, 7, 9, 2, 5]

    def plain(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1]

    for name, (tree, path) in TARGET_CASES.items():
        target.reset()
        logits = target.score(committed, tree).logits
        torch.testing.assert_close(logits[0], plain(committed), atol=1e-4, rtol=1e-4)
        for node in range(len(tree)):
            torch.testing.assert_close(logits[node + 1], plain(committed + tree.tokens[tree.path_to(node)].tolist()),
                                       atol=1e-4, rtol=1e-4, msg=lambda m, at=f"{name}, node {node}": f"{at}: {m}")
        target.commit(path)
        accepted = committed + tree.tokens[path].tolist() + [11]
        after = target.score(accepted, Draft.empty()).logits[-1]
        torch.testing.assert_close(after, plain(accepted), atol=1e-4, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")
    target.reset()  # the same runtime drafting a tree (a compiled draft model scores the tree so far)
    assert_tree_forward_matches_paths(target, model, committed, TopK(3, 2), atol=1e-4)
