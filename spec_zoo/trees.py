"""Token trees as a policy: *which* tree a drafter proposes, apart from *how* it computes
next-token distributions.

A drafter hands a policy an ``expand(tree, nodes)`` callable returning its logits after
each of ``nodes`` (``ROOT``: after the last committed token) of the tree grown so far; the
policy calls it once per level and returns a `Draft` with exact ``probs`` rows and the
``siblings`` mode the verifier needs (docs/trees.md). A policy is written as `TreePolicy.levels`,
a generator that yields each level's (tree, nodes) and is sent their logits (`spec_zoo.lockstep`),
so a batch's sequences can expand their levels in one model call; ``build`` drives it with ``expand``.

- `Chain`: one child per node, ``depth`` levels.
- `Static`: explicit paths of child ranks (Medusa's "choices"); `TopK` is the full
  ``width``-ary tree. Greedy: the ranked tokens (deterministic); sampled: children drawn
  without replacement (SpecTr/Sequoia), so siblings differ.
- `Dynamic` (EAGLE-2): expand the ``width`` newest nodes with the highest cumulative draft
  probability, keep the best ``budget`` nodes overall. The shape depends on the drawn
  tokens' own probabilities, so its children are always the top-ranked tokens
  (deterministic: exact under rejection with q one-hot, at any temperature).
- `Auto`: the static tree predicted fastest on this machine: expected accepted tokens
  (from acceptance rates per sibling rank, learnt online) over the step's cost (draft
  forwards + the target's measured scoring cost t(M), `spec_zoo.costs`).
- `MultiDraft` (SpecInfer): ``n`` chains sampled independently, merged on shared prefixes;
  a token drawn again at a node is recorded in ``Draft.draws`` so the rule replays it.

`DraftTreeForward` is the ``expand`` of a draft model run through `Target`: one forward
per level with a tree attention mask over its own cache, never re-scoring the tree.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import torch

from spec_zoo.costs import CostTable
from spec_zoo.draft import MAX_NODES, ROOT, Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Verdict
from spec_zoo.lockstep import Steps, drive
from spec_zoo.runtime.target import NextLogits, Target
from spec_zoo.sampling import logits_to_probs, sample, sample_distinct

Expand = Callable[[Draft, list[int]], torch.Tensor]  # (tree so far, nodes) -> logits [len(nodes), V]


class Growing:
    """A tree being built: tokens, parents, q rows (sampled nodes) and repeated draws."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.rows: list[torch.Tensor] = []
        self.draws: dict[int, list[int]] = {}

    def add(self, parent: int, token: int, q: torch.Tensor | None = None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.rows.append(q)
        return len(self.tokens) - 1

    def shape(self) -> Draft:
        """The structure so far (what ``expand`` reads)."""
        return Draft(torch.tensor(self.tokens, dtype=torch.long), self.parents)

    def draft(self, siblings: str) -> Draft:
        probs = torch.stack(self.rows) if self.rows else None
        return Draft(torch.tensor(self.tokens, dtype=torch.long), self.parents, probs,
                     siblings if probs is not None else None, self.draws or None)


def ranked(logits: torch.Tensor, k: int, state: DecodeState, sampled: bool) -> tuple[list[int], torch.Tensor | None]:
    """Up to ``k`` distinct children from one row of logits: the top-k tokens (q None), or
    ``k`` draws without replacement from q, in draw order (q returned)."""
    if not sampled:  # never a token the draft rules out (-inf: a reduced draft vocabulary)
        return torch.topk(logits, min(k, int(torch.isfinite(logits).sum()))).indices.tolist(), None
    q = logits_to_probs(logits, state.sampling)
    k = min(k, int((q > 0).sum()))  # top-k / top-p may leave fewer tokens than k
    return sample_distinct(q.to(state.generator.device), k, state.generator), q


class TreePolicy(ABC):
    """Builds the step's tree by calling ``expand`` once per level."""

    name = "tree"
    cost_key: str | None = None  # its drafter's measured drafting cost in a cost table (`spec_zoo.costs.file_costs`)

    @property
    def branches(self) -> bool:
        """False: its drafts are chains (chain-only verifiers accept the drafter)."""
        return True

    def sibling_modes(self, sampled: bool) -> tuple[str, ...]:
        """The ``Draft.siblings`` its drafts use (what a verifier must be exact for)."""
        return ("without_replacement",) if sampled else ("deterministic",)

    def build(self, expand: Expand, state: DecodeState, sampled: bool) -> Draft:
        """The tree for this step (at most ``state.max_depth`` deep), each level expanded by ``expand``."""
        return drive(self.levels(state, sampled), lambda ask: expand(*ask))

    @abstractmethod
    def levels(self, state: DecodeState, sampled: bool) -> Steps[Draft]:
        """`build` as steps: yields (the tree so far, the nodes to expand) once per level, is sent
        their logits [len(nodes), V], and returns the tree."""

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        """What was accepted of the last tree (a policy may learn from it)."""


class Static(TreePolicy):
    """choices: paths of child ranks, e.g. ``[[0], [1], [0, 0]]`` (the top token, the second,
    and the top token after the top one). Every path's prefixes are paths too, and a node's
    children are ranks 0..k-1 (a sampled node's k children are its first k draws)."""

    name = "static"

    def __init__(self, choices):
        paths = sorted({tuple(int(r) for r in path) for path in choices}, key=lambda p: (len(p), p))
        if not paths or any(not p for p in paths):
            raise ConfigError(f"tree.choices={choices!r}: give a non-empty list of non-empty paths, "
                              "e.g. [[0],[1],[0,0]].")
        known = set(paths)
        for path in paths:
            needed = path[:-1] if path[-1] == 0 else (*path[:-1], path[-1] - 1)
            if needed and needed not in known:
                raise ConfigError(f"tree.choices: {list(path)} needs {list(needed)} too (every path's "
                                  "prefix and its lower-ranked sibling must be listed).")
        self.paths = paths

    @property
    def depth(self) -> int:
        return len(self.paths[-1])

    @property
    def branches(self) -> bool:
        return any(path[-1] > 0 for path in self.paths)

    def levels(self, state: DecodeState, sampled: bool) -> Steps[Draft]:
        tree = Growing()
        node_of: dict[tuple[int, ...], int] = {(): ROOT}
        for level in range(1, min(self.depth, state.max_depth) + 1):
            width: dict[tuple[int, ...], int] = {}  # parent path -> children wanted
            for path in self.paths:
                if len(path) == level and path[:-1] in node_of:  # absent: q had too few tokens
                    width[path[:-1]] = max(width.get(path[:-1], 0), path[-1] + 1)
            logits = yield tree.shape(), [node_of[parent] for parent in width]
            for row, (parent, k) in zip(logits, width.items()):
                kids, q = ranked(row, k, state, sampled)
                for rank, token in enumerate(kids):
                    node_of[(*parent, rank)] = tree.add(node_of[parent], token, q)
        return tree.draft(self.sibling_modes(True)[0])


def check_nodes(key: str, nodes: int, what: str) -> None:
    """Refuse a tree policy whose drafts would have more than `MAX_NODES` nodes, with the count."""
    if nodes > MAX_NODES:  # a count past a float's range is shown by its digits (no OverflowError)
        count = f"{nodes:.3g}" if nodes < 10**300 else f"over 10^{len(str(nodes)) - 1}"
        raise ConfigError(f"{key}: {what} make {count} nodes per draft, more than the {MAX_NODES} a draft may "
                          f"have (one target forward scores them all); use a smaller tree, e.g. width 4, depth 4.")


class TopK(Static):
    """``width`` children per node, ``depth`` levels: width + width^2 + ... nodes."""

    name = "topk"

    def __init__(self, width: int = 2, depth: int = 3):
        if width < 1 or depth < 1:
            raise ConfigError(f"tree.width={width}, tree.depth={depth}: both must be >= 1.")
        check_nodes("tree.depth" if width == 1 else "tree.width",
                    depth if width == 1 else (width ** (min(depth, 64) + 1) - width) // (width - 1),
                    f"width {width} over depth {depth}")
        self.width = width
        super().__init__([p for d in range(1, depth + 1) for p in _ranks(width, d)])


class Chain(TopK):
    """One child per node: a chain of ``depth`` tokens (sampled ones keep their q)."""

    name = "chain"

    def __init__(self, depth: int = 4):
        super().__init__(1, depth)

    def sibling_modes(self, sampled: bool) -> tuple[str, ...]:
        return ("iid",) if sampled else ("deterministic",)


def _ranks(width: int, depth: int) -> list[tuple[int, ...]]:
    if depth == 0:
        return [()]
    return [(*p, r) for p in _ranks(width, depth - 1) for r in range(width)]


class Dynamic(TreePolicy):
    """EAGLE-2 (Li et al. 2024): each level expands the ``width`` newest nodes with the
    highest cumulative draft probability (the product of the draft's softmax along the
    path), each into its top ``width`` tokens; after ``depth`` levels the ``budget`` best
    nodes by that score are kept (a child never outscores its parent, so they form a tree).
    Deterministic at any temperature: which nodes survive depends on their own
    probabilities, so sampling them would bias q."""

    name = "dynamic"

    def __init__(self, width: int = 4, depth: int = 5, budget: int = 16):
        if width < 1 or depth < 1 or budget < 1:
            raise ConfigError(f"tree.width={width}, tree.depth={depth}, tree.budget={budget}: all must be >= 1.")
        check_nodes("tree.width", width * width * depth, f"width {width} x {width} candidates over depth {depth}")
        self.width, self.depth, self.budget = width, depth, budget

    def sibling_modes(self, sampled: bool) -> tuple[str, ...]:
        return ("deterministic",)

    def levels(self, state: DecodeState, sampled: bool) -> Steps[Draft]:
        tree, score = Growing(), []
        frontier, base = [ROOT], {ROOT: 0.0}
        for _ in range(min(self.depth, state.max_depth)):
            newest = []
            for node, logits in zip(frontier, (yield tree.shape(), frontier)):
                logp = logits.float().log_softmax(-1)
                top = torch.topk(logp, min(self.width, int(torch.isfinite(logp).sum())))
                for lp, token in zip(top.values.tolist(), top.indices.tolist()):
                    newest.append(tree.add(node, token))
                    score.append(base[node] + lp)
            best = sorted(newest, key=lambda i: -score[i])[: self.width]
            frontier, base = best, {i: score[i] for i in best}
        # the budget best (ties: shallower first, so a parent precedes its equal-scored child)
        depths = tree.shape().depths
        keep = sorted(sorted(range(len(score)), key=lambda i: (-score[i], depths[i], i))[: self.budget])
        remap = {old: new for new, old in enumerate(keep)}
        parents = [ROOT if tree.parents[i] == ROOT else remap[tree.parents[i]] for i in keep]
        return Draft(torch.tensor([tree.tokens[i] for i in keep], dtype=torch.long), parents)


class MultiDraft(TreePolicy):
    """SpecInfer (Miao et al. 2024): ``n`` chains of ``depth`` tokens, each sampled from the
    draft independently, merged into one tree on shared prefixes. Greedy drafting makes
    the ``n`` chains one chain."""

    name = "multi_draft"

    def __init__(self, n: int = 3, depth: int = 4):
        if n < 1 or depth < 1:
            raise ConfigError(f"tree.n={n}, tree.depth={depth}: both must be >= 1.")
        check_nodes("tree.n", n * depth, f"{n} chains of depth {depth}")
        self.n, self.depth = n, depth

    def sibling_modes(self, sampled: bool) -> tuple[str, ...]:
        return ("iid",) if sampled else ("deterministic",)

    def levels(self, state: DecodeState, sampled: bool) -> Steps[Draft]:
        tree = Growing()
        at = [ROOT] * self.n  # the node each chain has reached
        for _ in range(min(self.depth, state.max_depth)):
            frontier = list(dict.fromkeys(at))
            logits = dict(zip(frontier, (yield tree.shape(), frontier)))
            child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
            for j, node in enumerate(at):
                if sampled:
                    q = logits_to_probs(logits[node], state.sampling)
                    token = int(sample(q.to(state.generator.device), state.generator))
                else:
                    q, token = None, int(logits[node].argmax())
                if (node, token) not in child:
                    child[(node, token)] = tree.add(node, token, q)
                at[j] = child[(node, token)]
                tree.draws.setdefault(node, []).append(at[j])
        if not sampled or all(len(order) == len(set(order)) for order in tree.draws.values()):
            tree.draws = {}  # every token drawn once: the children in order say it all
        return tree.draft("iid")


# per-rank acceptance: prior 0.5 / 2^rank, ~20-step memory
RANK_PRIOR_ACCEPT, RANK_PRIOR_WEIGHT, RANK_DECAY = 0.5, 2.0, 0.95

Relative = Callable[[int], float]  # M scored tokens -> t(M) / t(1)


def path_shape(parents: list[int], path: list[int]) -> tuple[list[int], list[int]]:
    """What a verified tree says about acceptance per sibling rank: for each node on the
    accepted path (the root first), how many children it had, and the rank (position among
    its siblings) of the child that was accepted."""
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        kids.setdefault(parent, []).append(node)
    on_path = [ROOT, *path]
    return [len(kids.get(node, ())) for node in on_path], [kids[p].index(c) for p, c in zip(on_path, path)]


class RankAcceptance:
    """acc[r]: how often a node's rank-r child is the accepted one, among the reached nodes
    that had a rank-r child (SpecInfer/Sequoia's positional acceptance). Counts decay by
    ``decay`` per observed node (1: plain counts, as a replay of a whole run uses); a rank
    never drafted keeps its prior, so chains alone say nothing against trees."""

    def __init__(self, width: int, decay: float = RANK_DECAY):
        self.decay = decay
        self.seen = [0.0] * width  # times the rank-r child was the accepted one
        self.tried = [0.0] * width  # reached nodes with a rank-r child

    def observe(self, widths: list[int], ranks: list[int]) -> None:
        """One verified tree, as `path_shape` describes it."""
        for j, width in enumerate(widths):
            if width:
                self.fade()
                self.tried = [t + (r < width) for r, t in enumerate(self.tried)]
                if j < len(ranks) and ranks[j] < len(self.seen):
                    self.seen[ranks[j]] += 1

    def fade(self) -> None:
        self.seen = [s * self.decay for s in self.seen]
        self.tried = [t * self.decay for t in self.tried]

    def rates(self) -> list[float]:
        """acc[r] (prior 0.5 / 2^r), made non-increasing in r (a lower-ranked token is the
        likelier one), which is what makes taking the most valuable nodes first optimal."""
        rates = [(seen + RANK_PRIOR_ACCEPT / 2**r * RANK_PRIOR_WEIGHT) / (tried + RANK_PRIOR_WEIGHT)
                 for r, (seen, tried) in enumerate(zip(self.seen, self.tried))]
        return [min(rates[: r + 1]) for r in range(len(rates))]


def tree_value(paths, acc: list[float]) -> float:
    """Expected tokens a step with the static tree ``paths`` commits: 1 + the sum over nodes
    of the product of acc[rank] along the node's path."""
    value = {(): 1.0}
    for path in sorted(paths, key=len):
        value[path] = value[path[:-1]] * acc[path[-1]]
    return sum(value.values())


def tree_cost(paths, draft_cost: float, relative: Relative) -> float:
    """A step's cost in target forwards: one draft forward per level + scoring the tree."""
    return draft_cost * max((len(p) for p in paths), default=0) + relative(len(paths) + 1)


def best_tree(acc: list[float], relative: Relative, draft_cost: float, max_nodes: int, max_depth: int,
              max_width: int) -> tuple[list[tuple[int, ...]], float, float]:
    """(paths, expected tokens, cost) of the static tree with the highest predicted speed
    (tokens / cost) within the limits. For each depth cap the best tree of n nodes is the n
    most valuable nodes (a node is worth no more than its parent or its lower-ranked
    sibling), taken from a heap, so no tree within the limits is predicted faster."""
    best: list[tuple[int, ...]] = []
    best_value, best_cost = 1.0, tree_cost([], draft_cost, relative)
    for cap in range(1, max_depth + 1):
        paths: list[tuple[int, ...]] = []
        frontier: list[tuple[float, tuple[int, ...]]] = [(-acc[0], (0,))]
        while frontier and len(paths) < max_nodes:
            worth, path = heapq.heappop(frontier)
            paths.append(path)
            if path[-1] + 1 < max_width:  # its next sibling
                heapq.heappush(frontier, (worth / acc[path[-1]] * acc[path[-1] + 1], (*path[:-1], path[-1] + 1)))
            if len(path) < cap:  # its first child
                heapq.heappush(frontier, (worth * acc[0], (*path, 0)))
            value, cost = tree_value(paths, acc), tree_cost(paths, draft_cost, relative)
            if value / cost > best_value / best_cost:
                best, best_value, best_cost = list(paths), value, cost
    return best, best_value, best_cost


class Auto(TreePolicy):
    """The tree size from the cost model: each step, the static tree (at most ``max_nodes``
    nodes, ``max_depth`` levels, ``max_width`` children per node) with the highest
    predicted speed, tokens per step / cost per step in target forwards (`best_tree`):

        (1 + sum over nodes of the product of acc[rank] along its path)
        / (draft_cost x levels + t(nodes + 1) / t(1))

    acc[r] is learnt from every verified tree (`RankAcceptance`); t is the target's measured
    cost table when the run carries one (`DecodeState.cost_table`), else 1 + ``scoring_cost``
    per extra token, and draft_cost the drafter's measured cost per tree level from that table
    (``spec-zoo costs drafter=... drafter.tree=auto``, under ``cost_key``) where it has one, else
    the configured ``draft_cost``. A stored table, not the clock: sampled runs stay reproducible.
    ``prediction`` keeps the (tokens, cost) predicted for the last tree, so a benchmark can set
    it against what was measured."""

    name = "auto"

    def __init__(self, max_nodes: int = 16, max_depth: int = 6, max_width: int = 4,
                 draft_cost: float = 0.1, scoring_cost: float = 0.1):
        if min(max_nodes, max_depth, max_width) < 1 or not 0 <= draft_cost < 1 or not 0 <= scoring_cost < 1:
            raise ConfigError(f"tree.max_nodes={max_nodes}, tree.max_depth={max_depth}, tree.max_width={max_width}: "
                              f">= 1; tree.draft_cost={draft_cost}, tree.scoring_cost={scoring_cost}: in [0, 1).")
        check_nodes("tree.max_nodes", max_nodes, f"tree.max_nodes={max_nodes}")
        check_nodes("tree.max_width", max_width * max_depth, f"width {max_width} over depth {max_depth}")
        self.max_nodes, self.max_depth, self.max_width = max_nodes, max_depth, max_width
        self.draft_cost, self.scoring_cost = draft_cost, scoring_cost
        self.stats = RankAcceptance(max_width)
        self.paths: list[tuple[int, ...]] = []
        self.prediction = (1.0, 1.0)  # (expected tokens, cost in target forwards) of the last tree

    @property
    def predicted(self) -> float:
        """Predicted speed of the last tree, in tokens per target forward."""
        return self.prediction[0] / self.prediction[1]

    def acceptance(self) -> list[float]:
        return self.stats.rates()

    def relative_cost(self, tokens: int, table: CostTable | None) -> float:
        """t(tokens) / t(1): from ``table`` when given, else the linear ``scoring_cost`` prior."""
        return table.relative(tokens) if table is not None else 1.0 + self.scoring_cost * (tokens - 1)

    def plan(self, acc: list[float], table: CostTable | None,
             depth: int) -> tuple[list[tuple[int, ...]], tuple[float, float]]:
        """(paths, (expected tokens, cost)) of the best tree at most ``depth`` deep, scoring and
        drafting priced by ``table`` (None: the priors)."""
        drafting = table.draft_cost(self.cost_key, self.draft_cost) if table is not None else self.draft_cost
        paths, value, cost = best_tree(acc, lambda m: self.relative_cost(m, table), drafting,
                                       self.max_nodes, min(depth, self.max_depth), self.max_width)
        return paths, (value, cost)

    def levels(self, state: DecodeState, sampled: bool) -> Steps[Draft]:
        self.paths, self.prediction = self.plan(self.acceptance(), state.cost_table, state.max_depth)
        if not self.paths:
            return Draft.empty()
        return (yield from Static(self.paths).levels(state, sampled))

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        if not len(draft):  # nothing learnt: let the evidence fade so drafting is tried again
            self.stats.fade()
            return
        self.stats.observe(*path_shape(draft.parents, verdict.path))


def build_tree_policy(spec) -> TreePolicy | None:
    """A drafter's ``tree`` setting: None (its own chain), a `TreePolicy`, an option name of
    ``conf/tree/`` (``dynamic``), or a dict naming one under ``policy`` with overrides
    (``{policy: topk, width: 3}``)."""
    from omegaconf import DictConfig, OmegaConf

    from spec_zoo.registry import build_option, option_names

    if spec is None or isinstance(spec, TreePolicy):
        return spec
    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    values = {"policy": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, Mapping) else None
    name = None if values is None else values.pop("policy", None)
    if values is None or name not in option_names("tree"):
        raise ConfigError(f"drafter.tree={spec!r}: name a tree policy ({', '.join(option_names('tree'))}), "
                          "or give {policy: NAME, KEY: VALUE}, e.g. drafter.tree={policy:topk,width:3}.")
    try:
        return build_option("tree", name, **values)
    except ConfigError:
        raise
    except Exception as err:  # hydra wraps the constructor's complaint (an unknown key)
        cause = err.__cause__ or err
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"drafter.tree={spec!r}: {str(cause).splitlines()[0]}; "
                          f"see conf/tree/{name}.yaml for its keys.") from None


class TreeLevels:
    """Where a tree fed level by level sits in a cache, after ``past`` cached positions: each
    batch of nodes gets positions ``past + depth`` and an additive mask letting a node see
    the cached positions, its ancestors fed earlier (their ancestors first) and itself."""

    def __init__(self, past: int):
        self.past = past
        self.slot: dict[int, int] = {}  # fed node -> its cache position

    def place(self, tree: Draft, nodes: list[int]) -> tuple[list[int], list[list[int]]]:
        """Feed ``nodes`` now: (their positions, and each one's path of cache slots, its
        ancestors root first and then its own slot), the form a static cache's compiled
        attention reads (`spec_zoo.runtime.compiled_head`)."""
        length = self.past + len(self.slot)
        paths = [[self.slot[a] for a in tree.path_to(node)[:-1]] + [length + row] for row, node in enumerate(nodes)]
        self.slot.update({node: length + row for row, node in enumerate(nodes)})
        return [self.past + tree.depths[n] for n in nodes], paths

    def feed(self, tree: Draft, nodes: list[int], dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids [1, k], mask [1, 1, k, cached + k]) for feeding ``nodes`` now."""
        length, k = self.past + len(self.slot), len(nodes)
        positions, paths = self.place(tree, nodes)
        allowed = torch.zeros(k, length + k, dtype=torch.bool)
        allowed[:, : self.past] = True
        for row, path in enumerate(paths):
            allowed[row, path] = True
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return torch.tensor([positions]).to(device), mask[None, None].to(device)


class DraftTreeForward:
    """``expand`` for a draft model driven by an eager `Target` (its own KV cache): the first call
    scores the committed tokens, each later one feeds only the requested nodes, in one
    forward (`TreeLevels`, `Target.extend`). The tree's KV stays behind the committed tokens until the
    runner's next ``score`` crops it. (A compiled runner, a static cache and fixed graphs, expands
    by `tree_so_far`.) ``to_vocab`` maps the model's logits to the target's vocabulary."""

    def __init__(self, runner: Target, committed: list[int], to_vocab: Callable[[torch.Tensor], torch.Tensor]):
        self.runner, self.committed, self.to_vocab = runner, committed, to_vocab
        self.levels = TreeLevels(len(committed))

    @torch.no_grad()
    def __call__(self, tree: Draft, nodes: list[int]) -> torch.Tensor:
        runner = self.runner
        if nodes == [ROOT]:
            return self.to_vocab(runner.score(self.committed, Draft.empty()).logits[-1:])
        positions, mask = self.levels.feed(tree, nodes, runner.dtype, runner.device)
        return self.to_vocab(runner.extend(tree.tokens[nodes], positions, mask))


def tree_so_far(runner: Target, state: dict, committed: list[int],
                to_vocab: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[tuple[Draft, list[int]]], Steps]:
    """The ``expand`` of a draft model with a static cache of its own (a compiled runner), as asks
    (`spec_zoo.lockstep`): each level scores the tree so far after the committed tokens in one
    forward (a `NextLogits` of the sequence whose state ``state`` is) and reads the rows of the
    nodes it expands, so a batch's sequences expand a level in one call of the runner's graph."""
    def expand(ask: tuple[Draft, list[int]]) -> Steps[torch.Tensor]:
        tree, nodes = ask
        logits = yield NextLogits(runner, state, list(committed), tree)
        return to_vocab(logits[[0 if node == ROOT else node + 1 for node in nodes]])

    return expand
