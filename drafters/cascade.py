"""``drafter=cascade``: try member drafters in order, use the first that proposes.

Typical: ``drafter.members=[ngram,eagle]``: prompt lookup is free and, when it matches,
long; the EAGLE head covers the steps where the lookup finds nothing or has lately been
rejected. Members are named by their ``conf/drafter/*.yaml`` option names (composed with
Hydra, built with ``hydra.utils.instantiate``), given as dicts with ``_target_``, or, from
Python, as `Drafter` instances.

This module also holds `ComposedDrafter`, the part shared with ``drafter=merge``
(`spec_zoo.drafters.merge`): resolving and checking members before any of them is built,
forwarding ``attach`` / ``begin`` / ``on_commit`` / target features to every member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from spec_zoo.draft import ROOT, Draft
from spec_zoo.draft_length import TIME_DECAY
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.registry import build_component
from spec_zoo.stats import StepStats

KEY = "drafter.members"


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _member_class(target: str, where: str) -> type:
    from hydra.utils import get_class

    try:
        return get_class(target)
    except Exception:  # hydra raises ImportError or ValueError depending on the failure
        raise ConfigError(f"{where}: _target_={target!r} cannot be imported; check the spelling "
                          "and that its package is installed.") from None


def resolve_members(members, params, owner: type, ancestry: tuple[type, ...] = ()) -> list[tuple[str, object]]:
    """(label, config dict or `Drafter`) per member, checked, with nothing built yet.

    Names are composed from ``conf/drafter/``; a member that is itself a composed drafter
    is resolved recursively, so a cycle (a cascade inside itself, a merge inside a cascade
    inside a merge) is a `ConfigError` before any model loads."""
    from spec_zoo.registry import compose_option, option_names

    members, params = _plain(members), _plain(params) or {}
    ancestry = (*ancestry, owner)
    kind = owner.name
    if isinstance(members, (str, Mapping, Drafter)) or not isinstance(members, Sequence) or not members:
        raise ConfigError(f"{KEY}={members!r}: a {kind} needs a non-empty list of drafters, "
                          f"e.g. drafter.members=[ngram,eagle].")
    if not isinstance(params, Mapping):
        raise ConfigError(f"drafter.params={params!r}: give a dict member name -> overrides, "
                          "e.g. drafter.params={ngram:{num_draft:8}}.")
    resolved, labels = [], []
    for i, member in enumerate(members):
        shown = member.get("_target_") if isinstance(member, Mapping) else getattr(member, "name", member)
        where = f"{KEY}[{i}]={shown}"
        if isinstance(member, Drafter):
            if isinstance(member, ComposedDrafter) and type(member) in ancestry:
                raise ConfigError(f"{where}: a {kind} cannot contain a {member.name} again (a cycle); "
                                  "list that drafter's own members instead.")
            label, entry = member.name, member
        elif isinstance(member, str):
            if member not in option_names("drafter"):
                raise ConfigError(f"{where} is unknown; members are options of conf/drafter/: "
                                  f"{', '.join(option_names('drafter'))} (or a dict with _target_).")
            label, entry = member, _plain(compose_option("drafter", member))
        elif isinstance(member, Mapping) and "_target_" in member:
            label, entry = str(member["_target_"]).rsplit(".", 1)[-1], dict(member)
        else:
            raise ConfigError(f"{where}: a member is a conf/drafter/ option name (e.g. ngram), "
                              "a dict with _target_, or a Drafter.")
        if label in labels:  # listed again: params and costs address it as name_<position>
            label = f"{label}_{i}"
        labels.append(label)
        if isinstance(entry, dict):
            entry = {**entry, **(params.get(label) or {})}
            cls = _member_class(str(entry["_target_"]), where)
            if isinstance(cls, type) and issubclass(cls, ComposedDrafter):
                if cls in ancestry:
                    raise ConfigError(f"{where}: a {kind} cannot contain a {cls.name} (a cycle: "
                                      f"{' -> '.join(c.name for c in ancestry)} -> {cls.name}); "
                                      "list that drafter's own members instead.")
                resolve_members(entry.get("members"), entry.get("params"), cls, ancestry)
        resolved.append((label, entry))
    if unknown := sorted(set(params) - set(labels)):
        raise ConfigError(f"drafter.params has overrides for {unknown}, which are not members "
                          f"({', '.join(labels)}); key them by member name.")
    return resolved


def build_members(resolved: list[tuple[str, object]], ancestry: tuple[type, ...]) -> list[Drafter]:
    """Instantiate resolved members (draft models load here), errors naming the member. A
    nested composed drafter is built directly, told its ancestry (which YAML cannot carry)."""
    built = []
    for i, (label, entry) in enumerate(resolved):
        try:
            if isinstance(entry, Drafter):
                drafter = entry
            elif issubclass(cls := _member_class(entry["_target_"], label), ComposedDrafter):
                kwargs = {k: v for k, v in entry.items() if k not in ("_target_", "_recursive_")}
                drafter = cls(**kwargs, _ancestry=ancestry)
            else:
                drafter = build_component(OmegaConf.create(entry), f"{KEY}[{i}]")
        except ConfigError as err:
            raise ConfigError(f"{KEY}[{i}]={label}: {err}") from None
        built.append(drafter)
    return built


def member_verdict(own: Draft, committed: list[int], accepted: int) -> Verdict:
    """What a member is told after a step: the longest prefix of its own draft matching the
    ``accepted`` draft tokens that were committed, and the committed token after it. A
    member that proposed nothing (or was not asked) hears: empty path, first token."""
    path, node = [], ROOT
    tokens = own.tokens.tolist()
    for token in committed[:accepted]:
        child = next((c for c in own.children(node) if tokens[c] == token), None)
        if child is None:
            break
        path.append(child)
        node = child
    return Verdict(path, committed[len(path)], bonus=not own.children(node))


class ComposedDrafter(Drafter):
    """Members, resolved and checked before any is built, kept in sync with the sequence.

    Every member sees ``attach`` and ``begin``, and ``on_commit`` every step with its own
    draft (empty when it was not asked) and its own view of the verdict (`member_verdict`),
    so its acceptance statistics stay its own; caches and tables follow the committed
    tokens as in any drafter, from ``state.tokens`` at the next ``propose``. Target features
    (``needs_target_hidden``, true when any member needs them) are buffered per member until
    it is next asked, so a member skipped for some steps still receives every position.
    """

    name = "composed"

    def __init__(self, members, params=None, _ancestry: tuple[type, ...] = ()):
        resolved = resolve_members(members, params, type(self), _ancestry)
        self.labels = [label for label, _ in resolved]
        self.check(self.labels)
        self.members = build_members(resolved, (*_ancestry, type(self)))
        self.needs_target_hidden = any(m.needs_target_hidden for m in self.members)
        self.drafts_trees = type(self).drafts_trees or any(m.drafts_trees for m in self.members)
        self.sibling_modes = tuple(sorted({mode for m in self.members for mode in m.sibling_modes}))
        self.vocab_size: int | None = None
        self._own: list[Draft] = [Draft.empty() for _ in self.members]

    def check(self, labels: list[str]) -> None:
        """Check this drafter's own settings, before any member is built (a model may load)."""

    def attach(self, target) -> None:
        self.vocab_size = target.vocab_size
        for i, member in enumerate(self.members):
            try:
                member.attach(target)
            except ConfigError as err:
                raise ConfigError(f"{KEY}[{i}]={self.labels[i]}: {err}") from None

    def begin(self, state: DecodeState) -> None:
        self._pending: list[list[torch.Tensor]] = [[] for _ in self.members]
        self._seen = None
        for member in self.members:
            member.begin(state)

    def _collect(self, state: DecodeState) -> None:
        """Queue this step's target features for every member that reads them."""
        hidden = state.target_hidden
        if hidden is None or hidden is self._seen:
            return
        self._seen = hidden
        for i, member in enumerate(self.members):
            if member.needs_target_hidden:
                self._pending[i].append(hidden)

    def _ask(self, i: int, state: DecodeState) -> Draft:
        """Member ``i``'s draft, given the features it has not seen yet; checked against the
        target's vocabulary (members built from different models must agree with it)."""
        member = self.members[i]
        if member.needs_target_hidden:
            pending, self._pending[i] = self._pending[i], []
            state = dataclasses.replace(state, target_hidden=torch.cat(pending) if pending else None)
        draft = member.propose(state)
        vocab = self.vocab_size
        if vocab is not None and len(draft):
            width = None if draft.probs is None else draft.probs.shape[-1]
            if (width is not None and width != vocab) or int(draft.tokens.max()) >= vocab:
                raise ConfigError(f"{KEY}[{i}]={self.labels[i]} drafts over a vocabulary of "
                                  f"{width or int(draft.tokens.max()) + 1}+ tokens but the target has {vocab}: "
                                  "every member must share the target's tokenizer.")
        self._own[i] = draft
        return draft

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        committed = [int(draft.tokens[n]) for n in verdict.path] + [verdict.next_token]
        for i, member in enumerate(self.members):
            own = self._own[i]
            if own is draft:  # the member whose draft was scored as is: the verdict itself
                member.on_commit(draft, verdict, step)
            else:
                mine = member_verdict(own, committed, len(verdict.path))
                member.on_commit(own, mine, StepStats(len(own), len(mine.path), own.depth, step.committed,
                                                      step.draft_s if len(own) else 0.0, step.verify_s))
            self._own[i] = Draft.empty()


# the cascade's estimate of a member: tokens per step over cost per step, decayed counts
PRIOR_TOKENS, PRIOR_DRAFTED = 2.0, 1.0  # one pseudo-step: 1 drafted, accepted (optimistic: try it)
DECAY = 0.9  # weight of past steps per step (memory of ~10 steps); skipped members drift back to the prior


class CascadeDrafter(ComposedDrafter):
    """Asks members in order; the first non-empty draft is the step's draft.

    Its own adaptive rule skips a member whose recent steps did not pay: per member it
    keeps decayed counts of steps it drafted, tokens those steps committed (1 + accepted)
    and tokens drafted, and estimates its speedup as committed tokens / cost in target
    forwards, a step costing 1 + ``cost`` x drafted. A member below ``min_speedup`` is
    skipped; its counts fade every step, so it is asked again after a few. When sampling,
    the rule uses counts and configured costs only, never timings, so a seeded run is
    reproducible. In greedy runs with a measured cost table (the text cannot depend on the
    choice there), a member's steps are priced by their measured time instead, in plain
    steps: seconds over t1, t1 being each step's scoring time over the table's t(M)/t(1);
    so a member whose drafting is dear on this machine (a head run eagerly next to a
    compiled target, a long document) is priced at what it costs.

    members:     drafter option names (``[ngram, eagle]``), dicts with ``_target_``, or `Drafter`s.
    params:      per-member overrides, keyed by member name (``{ngram: {num_draft: 8}}``; a
                 name listed twice is keyed ``name_<position>`` the second time).
    costs:       per-member cost of one drafted token in target forwards (drafting it plus
                 scoring it); a member not listed uses its own configured ``token_cost``
                 (0.1 for drafters without one).
    min_speedup: skip a member whose estimated speedup is below this (1.0: drafting loses time).

    Exactness: which member drafts depends only on the past, and the chosen member's ``q``
    is passed on unchanged, so exact verifiers stay exact.
    """

    name = "cascade"

    def __init__(self, members, params=None, costs=None, min_speedup: float = 1.0,
                 _ancestry: tuple[type, ...] = ()):
        self._costs, self.min_speedup = _plain(costs) or {}, min_speedup
        super().__init__(members, params, _ancestry)
        self.costs = [float(self._costs.get(label, getattr(getattr(member, "length", None), "prior_cost", 0.1)))
                      for label, member in zip(self.labels, self.members)]
        self._chosen: int | None = None
        self._reset_evidence()

    def check(self, labels: list[str]) -> None:
        costs = self._costs
        if not isinstance(costs, Mapping) or set(costs) - set(labels):
            raise ConfigError(f"drafter.costs={costs!r}: give a dict member name -> cost per drafted token "
                              f"for members among {', '.join(labels)}, e.g. +drafter.costs.eagle=0.1.")
        for label, cost in costs.items():
            if not isinstance(cost, (int, float)) or not 0.0 <= cost < 1.0:
                raise ConfigError(f"drafter.costs.{label}={cost}; a cost per drafted token in target "
                                  "forwards is in [0, 1).")
        if not isinstance(self.min_speedup, (int, float)) or self.min_speedup < 0:
            raise ConfigError(f"drafter.min_speedup={self.min_speedup}; use a ratio >= 0 (1.0 = skip members "
                              "that lose time, 0 = never skip).")

    def _reset_evidence(self) -> None:
        # per member: [steps, committed tokens, drafted tokens, timed tokens, timed seconds], decayed
        self._evidence = [[0.0] * 5 for _ in self.members]
        self._plain = [0.0, 0.0]  # decayed sum and weight of a plain step's seconds (t1)
        self._table, self._timed_steps = None, 0

    def speedup(self, i: int) -> float:
        """Estimated tokens per target-forward-equivalent when member ``i`` drafts: from its
        measured seconds when timings may steer and were taken, else from counts and costs."""
        steps, tokens, drafted, timed_tokens, seconds = self._evidence[i]
        prior = 1.0 + self.costs[i] * PRIOR_DRAFTED
        if self._table is not None and self._plain[1] > 0 and seconds > 0:
            return (PRIOR_TOKENS + timed_tokens) / (prior + seconds * self._plain[1] / self._plain[0])
        return (PRIOR_TOKENS + tokens) / (prior + steps + self.costs[i] * drafted)

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self._reset_evidence()
        self._chosen = None

    def propose(self, state: DecodeState) -> Draft:
        self._collect(state)
        self._chosen, self._table = None, state.cost_table
        for i in range(len(self.members)):
            if self.speedup(i) < self.min_speedup:
                continue
            draft = self._ask(i, state)
            if len(draft):
                self._chosen = i
                return draft
        return Draft.empty()

    def on_commit(self, draft: Draft, verdict: Verdict, step: StepStats) -> None:
        for counts in self._evidence:
            counts[:] = [c * DECAY for c in counts]
        # the first step's time holds the prompt's prefill: not a sample of a step
        timed = self._table is not None and self._timed_steps > 0
        self._timed_steps += 1
        if timed:
            self._plain = [self._plain[0] * TIME_DECAY + step.verify_s / self._table.relative(len(draft) + 1),
                           self._plain[1] * TIME_DECAY + 1.0]
        if self._chosen is not None and len(draft):
            counts = self._evidence[self._chosen]
            counts[0] += 1.0
            counts[1] += 1.0 + len(verdict.path)
            counts[2] += len(draft)
            if timed:
                counts[3] += 1.0 + len(verdict.path)
                counts[4] += step.draft_s + step.verify_s
        super().on_commit(draft, verdict, step)
