"""What the composed drafters (``drafter=cascade``, ``drafter=merge``) share: members
named by their ``conf/drafter/*.yaml`` option names (composed with Hydra, built with
``hydra.utils.instantiate``), dicts with ``_target_`` or `Drafter` instances, resolved and
checked before any is built (a cycle, an unknown name or a bad override fails before a model
loads), then kept in step with the sequence: ``attach`` / ``begin`` / ``on_commit`` and the
target's features forwarded to every member.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import abstractmethod
from collections.abc import Mapping, Sequence

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from spec_zoo.draft import ROOT, Draft
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict
from spec_zoo.lockstep import Steps, answer, drive
from spec_zoo.registry import build_component, compose_option, option_names
from spec_zoo.stats import StepStats

KEY = "drafter.members"


def plain_container(value):
    """A config value as plain Python (OmegaConf nodes resolved), anything else as is."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _member_class(target: str, where: str) -> type:
    from hydra.utils import get_class

    try:
        return get_class(target)
    except Exception:  # hydra raises ImportError or ValueError depending on the failure
        raise ConfigError(f"{where}: _target_={target!r} cannot be imported; check the spelling "
                          "and that its package is installed.") from None


def resolve_members(members, params, owner: type[ComposedDrafter],
                    ancestry: tuple[type[ComposedDrafter], ...] = ()) -> list[tuple[str, Drafter | dict]]:
    """(label, config dict or `Drafter`) per member, checked, with nothing built yet.

    Names are composed from ``conf/drafter/``; a member that is itself a composed drafter
    is resolved recursively, so a cycle (a cascade inside itself, a merge inside a cascade
    inside a merge) is a `ConfigError` before any model loads."""
    members, params = plain_container(members), plain_container(params) or {}
    ancestry = (*ancestry, owner)
    kind = owner.name
    if isinstance(members, (str, Mapping, Drafter)) or not isinstance(members, Sequence) or not members:
        raise ConfigError(f"{KEY}={members!r}: a {kind} needs a non-empty list of drafters, "
                          f"e.g. drafter.members=[ngram,eagle].")
    if not isinstance(params, Mapping):
        raise ConfigError(f"drafter.params={params!r}: give a dict member name -> overrides, "
                          "e.g. drafter.params={ngram:{num_draft:8}}.")
    resolved: list[tuple[str, Drafter | dict]] = []
    labels: list[str] = []
    for i, member in enumerate(members):
        entry: Drafter | dict
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
            label, entry = member, plain_container(compose_option("drafter", member))
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


def build_members(resolved: list[tuple[str, Drafter | dict]],
                  ancestry: tuple[type[ComposedDrafter], ...]) -> list[Drafter]:
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

    def __init__(self, members, params=None, _ancestry: tuple[type[ComposedDrafter], ...] = ()):
        resolved = resolve_members(members, params, type(self), _ancestry)
        self.labels = [label for label, _ in resolved]
        self.check(self.labels)
        self.members = build_members(resolved, (*_ancestry, type(self)))
        self.needs_target_hidden = any(m.needs_target_hidden for m in self.members)
        self.drafts_trees = type(self).drafts_trees or any(m.drafts_trees for m in self.members)
        self.sibling_modes = tuple(sorted({mode for m in self.members for mode in m.sibling_modes}))
        self.vocab_size: int | None = None
        self._own: list[Draft] = [Draft.empty() for _ in self.members]
        self.batches = all(m.batches for m in self.members)  # per sequence only if every member can be

    def hold(self, sequences: int) -> None:
        for member in self.members:
            member.hold(sequences)

    def level_cost(self, table) -> float:
        """Every member drafts (a merge): their costs added."""
        return sum(member.level_cost(table) for member in self.members)

    def for_sequence(self, slot: int) -> ComposedDrafter:
        """Each member's fork for the sequence; its own drafts and evidence (made by `begin`)."""
        twin = copy.copy(self)
        twin.members = [member.for_sequence(slot) for member in self.members]
        twin._own = [Draft.empty() for _ in self.members]
        return twin

    def check(self, labels: list[str]) -> None:
        """Check this drafter's own settings, before any member is built (a model may load)."""

    def attach(self, target) -> None:
        self.vocab_size = target.vocab_size
        for i, member in enumerate(self.members):
            try:
                member.attach(target)
            except ConfigError as err:
                raise ConfigError(f"{KEY}[{i}]={self.labels[i]}: {err}") from None
        # the states to ask of the target, known once the members are attached (an EAGLE-3 head names its layers
        # when its artefact loads); one forward hands out one kind
        wanted = {member.needs_target_hidden for member in self.members if member.needs_target_hidden}
        if len(wanted) > 1:
            raise ConfigError(f"{KEY}={self.labels}: members read different target states "
                              f"({', '.join('the last layer' if w is True else f'layers {w}' for w in wanted)}),"
                              " and a scoring pass hands out one kind; an EAGLE-3 head cannot share a cascade or merge "
                              "with drafters that read the last layer's (use lookups beside it, e.g. [ngram, eagle]).")
        self.needs_target_hidden = wanted.pop() if wanted else False

    def compiled_parts(self) -> list:
        """The members' compiled draft models (what `spec-zoo warmup` compiles)."""
        return [part for m in self.members for part in getattr(m, "compiled_parts", list)()]

    def begin(self, state: DecodeState) -> None:
        self._pending: list[list[torch.Tensor]] = [[] for _ in self.members]
        self._seen: torch.Tensor | None = None
        for member in self.members:
            member.begin(state)

    def end(self, state: DecodeState) -> None:
        for member in self.members:
            member.end(state)

    def _collect(self, state: DecodeState) -> None:
        """Queue this step's target features for every member that reads them."""
        hidden = state.target_hidden
        if hidden is None or hidden is self._seen:
            return
        self._seen = hidden
        for i, member in enumerate(self.members):
            if member.needs_target_hidden:
                self._pending[i].append(hidden)

    def propose(self, state: DecodeState) -> Draft:
        return drive(self.drafting(state), answer)

    @property  # computes the attribute Drafter declares (a member's head is compiled at attach)
    def drafts_together(self) -> bool:  # type: ignore[override]
        return any(member.drafts_together for member in self.members)

    @abstractmethod
    def drafting(self, state: DecodeState) -> Steps[Draft]:
        """The step's draft from the members (`_asking` each), as steps (`spec_zoo.lockstep`): a
        member's shared model calls go out, so a batch's cascades share their EAGLE head's calls."""

    def _asking(self, i: int, state: DecodeState) -> Steps[Draft]:
        """Member ``i``'s draft (its `drafting` steps), given the features it has not seen yet;
        checked against the target's vocabulary (members built from different models must agree)."""
        member = self.members[i]
        if member.needs_target_hidden:
            pending, self._pending[i] = self._pending[i], []
            state = dataclasses.replace(state, target_hidden=torch.cat(pending) if pending else None)
        draft = yield from member.drafting(state)
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
