"""`SpeculativeDecoder`: the one loop, draft -> score -> verify -> commit.

Chains and trees go through the same four lines; an empty draft makes the step plain
autoregressive decoding, which is how ``drafter=none`` gives the baseline.
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from spec_zoo.batch_policy import BatchPolicy
from spec_zoo.draft import Draft
from spec_zoo.draft_length import Acceptance
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState, Drafter, Verdict, Verifier
from spec_zoo.lockstep import together
from spec_zoo.registry import build_option
from spec_zoo.runtime.target import Scores, Target
from spec_zoo.sampling import SamplingParams, stop_string_list
from spec_zoo.stats import RunStats, StepStats

if TYPE_CHECKING:
    from spec_zoo.costs import CostTable

#: called after every step's commit with the step's draft, verdict and complete `StepStats`
StepObserver = Callable[[Draft, Verdict, StepStats], None]


@dataclass
class Output:
    ids: list[int]  # generated token ids (prompt excluded)
    text: str | None  # decoded text (None without a tokenizer)
    stats: RunStats
    finish_reason: str  # "eos", "stop_string", "length", or "cache" (cut short: the target's context was full)
    prompt_ids: list[int]


@dataclass
class _Sequence:
    """One request in flight: its committed tokens (``state.tokens``), generator
    (``state.generator``), target cache, drafter and counts; nothing here is shared."""

    prompt_ids: list[int]
    state: DecodeState
    max_new_tokens: int
    eos: set[int]
    stop_strings: list[str]
    drafter: Drafter  # the decoder's, or its `for_sequence` fork when requests interleave
    generated: list[int] = field(default_factory=list)
    finish: str = "length"
    cache_bound: bool = False  # max_new_tokens was cut to the target's context: ending there is "cache"
    target_state: dict | None = None  # its target cache while other sequences are served
    slot: int = 0  # which of the sequences decoded at once it is (its cache entry on a static cache)
    start: float = 0.0
    acceptance: Acceptance = field(default_factory=Acceptance)  # what a batch policy prices its drafts by
    stats: RunStats = field(init=False)

    def __post_init__(self):
        self.stats = RunStats(prompt_tokens=len(self.prompt_ids))


class SpeculativeDecoder:
    """Composes a target, a drafter and a verifier under sampling parameters.

    cost_table: the target's measured scoring costs t(M) on this machine (`spec_zoo.costs`;
                `spec_zoo.api.build_decoder` looks it up) and drafters' measured drafting costs:
                every run prices draft lengths, trees and cascade members with it (sampled runs
                too: it is stored data, not the clock), at each step the curve for the context so
                far (`CostTable.at`). None: drafters use their configured priors.
    observers:  callables told of every step after its commit (`StepObserver`): how a
                benchmark traces a run without touching the drafter.
    batch_policy: how deep each live sequence's draft is scored when several share a forward
                (`spec_zoo.batch_policy`: goodput or a fixed schedule); None scores every draft
                as its drafter proposed. Greedy runs only: a sampled request's draws must not
                depend on its neighbours.
    """

    def __init__(
        self,
        target: Target,
        drafter: Drafter | None = None,
        verifier: Verifier | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        cost_table: CostTable | None = None,
        batch_policy: BatchPolicy | None = None,
    ):
        self.target = target
        self.cost_table = cost_table
        self.batch_policy = batch_policy
        self.observers: list[StepObserver] = []
        self.sampling = sampling or SamplingParams()
        # the defaults are the shipped options drafter=none and verifier=auto, built by name:
        # the core imports no drafter or verifier
        verifier = verifier or build_option("verifier", "auto", temperature=self.sampling.temperature)
        verifier.check(self.sampling)
        self.drafter = drafter or build_option("drafter", "none")
        verifier.check_drafter(self.drafter)
        self.verifier = verifier
        self.seed = seed
        self.drafter.attach(target)

    # -- prompt handling ------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int], chat: bool = True) -> list[int]:
        """Token ids of ``prompt``; text goes through the chat template when the
        tokenizer has one and ``chat`` is set (instruct models expect it)."""
        refuse_empty(prompt)
        if isinstance(prompt, str):
            tok = self._tokenizer()
            if chat and getattr(tok, "chat_template", None):
                _warn_chat_markers(prompt, tok)
                messages = [{"role": "user", "content": prompt}]
                return self.encode_chat(messages)
            return tok(prompt, add_special_tokens=True)["input_ids"]
        try:
            ids = [operator.index(t) for t in prompt if not isinstance(t, bool)]
        except TypeError:
            ids = None
        if ids is None or len(ids) != len(prompt):
            raise ConfigError(f"prompt: {list(prompt)[:8]!r} is not text or token ids; "
                              "pass a string or a list of ints.")
        vocab = self.target.vocab_size
        if bad := [t for t in ids if not 0 <= t < vocab]:
            raise ConfigError(
                f"prompt: token id {bad[0]} is outside the target's vocabulary (0..{vocab - 1}); "
                "pass ids from the target's tokenizer, or text."
            )
        return ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation, ending with the assistant's turn to speak."""
        if not getattr(self._tokenizer(), "chat_template", None):  # a base model (e.g. model=gemma3_270m)
            raise ConfigError("messages: this target's tokenizer has no chat template (a base model); "
                              "pass the text as a plain prompt, which it continues.")
        out = self._tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]

    def _tokenizer(self):
        if self.target.tokenizer is None:
            raise ConfigError("this target has no tokenizer; pass token ids instead of text.")
        return self.target.tokenizer

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen_cfg = getattr(self.target.model, "generation_config", None)
        for source in (getattr(gen_cfg, "eos_token_id", None), getattr(self.target.tokenizer, "eos_token_id", None)):
            if source is not None:
                ids.update(source if isinstance(source, (list, tuple)) else [source])
        return ids

    # -- the loop -------------------------------------------------------------------
    def _request(self, prompt, max_new_tokens, stop_strings, eos_token_ids, seed, request_id) -> _Sequence:
        """One request checked and encoded (before any decoding, so bad input costs nothing)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ConfigError(
                f"generation.max_new_tokens: {max_new_tokens!r} is not a positive integer; pass e.g. 64."
            )
        stop_strings = stop_string_list(stop_strings)
        prompt_ids = self.encode(prompt)
        limit = self.target.max_length
        if limit is not None and len(prompt_ids) >= limit:
            raise ConfigError(
                f"prompt has {len(prompt_ids)} tokens but the target's context is {limit} "
                f"({self.target.context_limit}); shorten the prompt."
            )
        cut = limit is not None and len(prompt_ids) + max_new_tokens > limit
        if limit is not None:
            max_new_tokens = min(max_new_tokens, limit - len(prompt_ids))
        eos = set(self._eos_ids() if eos_token_ids is None else eos_token_ids)
        generator = torch.Generator(device=self.target.device)
        generator.manual_seed(self.seed if seed is None else seed)
        # sampled output must not depend on timings; the cost table is data, so it prices every run
        state = DecodeState(list(prompt_ids), len(prompt_ids), max_new_tokens - 1, self.sampling, generator,
                            timings_steer=self.sampling.greedy, cost_table=self.cost_table, request_id=request_id)
        return _Sequence(prompt_ids, state, max_new_tokens, eos, stop_strings, self.drafter, cache_bound=cut)

    def slots(self, batch_size: int) -> int:
        """How many requests decode at once: ``batch_size`` when the target holds several caches
        and the drafter keeps per-sequence state (`Drafter.batches`), else 1 (one after another)."""
        return batch_size if batch_size > 1 and self.target.holds_many and self.drafter.batches else 1

    def _run(self, requests: list[_Sequence], batch_size: int,
             on_done: Callable[[int, Output], None] | None = None,
             ) -> Generator[tuple[int, list[int]], None, list[Output]]:
        """The loop: each step advances every live sequence by draft -> score -> verify -> commit,
        the target scoring all their drafts together (`Target.score_batch`), and yields (request
        index, tokens committed) per sequence. A finished request's slot goes to the next waiting
        one (continuous batching), and ``on_done`` hears of it at once. Every sequence has its own
        committed tokens, target cache, drafter state and generator, so its output is the one it
        gets decoded alone."""
        slots = self.slots(batch_size)
        self.target.hold(slots)
        self.drafter.hold(slots)
        waiting, live = list(enumerate(requests)), list[tuple[int, _Sequence]]()
        free = list(range(slots))
        outputs: list[Output | None] = [None] * len(requests)
        while waiting or live:
            while waiting and free:
                i, seq = waiting.pop(0)
                self._begin(seq, free.pop(0), fork=slots > 1)
                live.append((i, seq))
            seqs = [seq for _, seq in live]
            bounds = self._bounds(seqs)
            drafts = self._cut(self._propose_all(seqs, bounds), seqs)
            t0 = time.perf_counter()
            batch = [(seq.target_state, seq.state.tokens, draft) for (_, seq), (draft, _) in zip(live, drafts)]
            scores = self.target.score_batch(batch, hidden=self.drafter.needs_target_hidden)
            score_s = time.perf_counter() - t0  # each sequence waited for the whole batch's forward
            for (i, seq), (draft, draft_s), scored in zip(list(live), drafts, scores):
                step_tokens = self._settle(seq, draft, scored, draft_s, score_s)
                yield i, step_tokens
                if seq.finish != "length" or len(seq.generated) >= seq.max_new_tokens:
                    outputs[i] = out = self._end(seq)
                    live.remove((i, seq))
                    free.append(seq.slot)
                    if on_done is not None:
                        on_done(i, out)
        return [out for out in outputs if out is not None]

    def _begin(self, seq: _Sequence, slot: int, fork: bool) -> None:
        seq.drafter = self.drafter.for_sequence(slot) if fork else self.drafter
        seq.slot = slot
        self.target.reset(slot)
        if fork:  # alone, the target holds the one live sequence: nothing to swap
            seq.target_state = self.target.sequence()
        seq.start = time.perf_counter()
        seq.drafter.begin(seq.state)

    def _propose(self, seq: _Sequence, bound: int | None) -> tuple[Draft, float]:
        """The sequence's draft, at most ``bound`` deep (with the target holding its state, which a
        drafter may read), and the seconds drafting took."""
        if seq.target_state is not None:
            self.target.use(seq.target_state)
        asked = self._ready(seq, bound)
        t0 = time.perf_counter()
        # a drafter bounded to nothing this step is still asked: it follows every step (EAGLE takes its features)
        draft = seq.drafter.propose(seq.state) if asked else Draft.empty()
        draft = draft.truncated(seq.state.max_depth)
        seconds = time.perf_counter() - t0
        if seq.target_state is not None:
            seq.target_state = self.target.sequence()  # a drafter may have run the target (a partial forward)
        return draft, seconds

    def _propose_all(self, seqs: list[_Sequence], bounds: list[int | None]) -> list[tuple[Draft, float]]:
        """Every live sequence's draft (`_propose`): one after another, or, for a drafter that drafts
        together (`Drafter.drafts_together`), in lockstep (`spec_zoo.lockstep.together`: the calls a
        level makes for every sequence shared), each sequence then having waited for all the drafting."""
        if not self.drafter.drafts_together:
            return [self._propose(seq, bound) for seq, bound in zip(seqs, bounds)]
        asked = [seq for seq, bound in zip(seqs, bounds) if self._ready(seq, bound)]

        def enter(i: int) -> None:  # the target holds the sequence while its drafter runs (a drafter may read it)
            if (state := asked[i].target_state) is not None:
                self.target.use(state)

        def leave(i: int) -> None:
            if asked[i].target_state is not None:
                asked[i].target_state = self.target.sequence()

        t0 = time.perf_counter()
        made = together([seq.drafter.drafting(seq.state) for seq in asked], enter, leave)
        seconds, drafts = time.perf_counter() - t0, {id(seq): draft for seq, draft in zip(asked, made)}
        return [(drafts.get(id(seq), Draft.empty()).truncated(seq.state.max_depth), seconds) for seq in seqs]

    def _ready(self, seq: _Sequence, bound: int | None) -> bool:
        """Set the sequence's depth bound and cost table for drafting; whether it is to be asked for
        a draft at all (tokens are left to draft)."""
        state = seq.state
        state.max_depth = self._left(seq) if bound is None else min(bound, self._left(seq))
        if self.cost_table is not None:
            state.cost_table = self.cost_table.at(len(state.tokens))  # scoring is dearer after a longer context
        return self._left(seq) > 0

    @staticmethod
    def _left(seq: _Sequence) -> int:
        """The deepest draft worth scoring: tokens left, less the one the verifier adds."""
        return seq.max_new_tokens - len(seq.generated) - 1

    def _policy_table(self, seqs: list[_Sequence]) -> tuple[BatchPolicy | None, CostTable | None]:
        """The batch policy when it sets this step's depths (greedy runs of several sequences), and
        the cost table at the batch's mean context."""
        if self.batch_policy is None or len(seqs) < 2 or not self.sampling.greedy:
            return None, None
        if self.cost_table is None:
            return self.batch_policy, None
        return self.batch_policy, self.cost_table.at(sum(len(seq.state.tokens) for seq in seqs) // len(seqs))

    def _bounds(self, seqs: list[_Sequence]) -> list[int | None]:
        """How deep each sequence may draft this step (None: as deep as it likes): what the policy
        would score of chains as deep as each may go, so no drafting is spent on levels it cuts."""
        policy, table = self._policy_table(seqs)
        if policy is None:
            return [None] * len(seqs)
        return list(policy.bounds([self._left(seq) for seq in seqs], [seq.acceptance.rate for seq in seqs], table,
                                  [seq.drafter.level_cost(table) for seq in seqs],
                                  [seq.drafter.drafts_together for seq in seqs]))

    def _cut(self, drafts: list[tuple[Draft, float]], seqs: list[_Sequence]) -> list[tuple[Draft, float]]:
        """The drafts cut to the depths the batch policy scores (greedy runs of several sequences)."""
        policy, table = self._policy_table(seqs)
        if policy is None:
            return drafts
        depths = policy.depths([d for d, _ in drafts], [seq.acceptance.rate for seq in seqs], table)
        return [(draft.truncated(depth), s) for (draft, s), depth in zip(drafts, depths, strict=True)]

    def _settle(self, seq: _Sequence, draft: Draft, scores: Scores, draft_s: float, score_s: float) -> list[int]:
        """Verify the scored draft, commit the verdict to the target and the sequence, and return
        the tokens committed this step (cut at an eos or a stop string)."""
        t1 = time.perf_counter()
        state, drafter, tokens, generated = seq.state, seq.drafter, seq.state.tokens, seq.generated
        if seq.target_state is not None:
            self.target.use(seq.target_state)
        verdict = self.verifier.verify(draft, scores.logits, self.sampling, state.generator)
        self.target.commit(verdict.path)
        if seq.target_state is not None:
            seq.target_state = self.target.sequence()  # scoring and commit may replace what it holds
        t2 = time.perf_counter()
        if drafter.needs_target_hidden:
            m = scores.new_committed
            rows = list(range(m)) + [m + i for i in verdict.path]
            assert scores.hidden is not None  # asked for with needs_target_hidden
            state.target_hidden = scores.hidden[rows]
        if drafter.needs_draft_logits:
            state.draft_logits = scores.logits

        proposed = [int(draft.tokens[i]) for i in verdict.path] + [verdict.next_token]
        step_tokens = []
        for tok in proposed:
            step_tokens.append(tok)
            if tok in seq.eos:
                seq.finish = "eos"
                break
            if len(generated) + len(step_tokens) >= seq.max_new_tokens:
                break
        if seq.stop_strings and seq.finish != "eos":
            step_tokens, hit = self._cut_at_stop(generated, step_tokens, seq.stop_strings)
            seq.finish = "stop_string" if hit else seq.finish
        tokens += step_tokens
        generated += step_tokens
        step = StepStats(len(draft), len(verdict.path), draft.depth, len(step_tokens), draft_s, score_s + t2 - t1)
        seq.acceptance.update(draft.depth, len(verdict.path))
        drafter.on_commit(draft, verdict, step)
        for observe in self.observers:
            observe(draft, verdict, step)
        seq.stats.steps.append(step)
        return step_tokens

    def _end(self, seq: _Sequence) -> Output:
        seq.stats.new_tokens = len(seq.generated)
        seq.stats.wall_s = time.perf_counter() - seq.start  # in a batch, its neighbours' steps too
        seq.drafter.end(seq.state)  # after the clock: what a drafter files (a suffix cache saved) is not decoding
        tok = self.target.tokenizer
        text = tok.decode(seq.generated, skip_special_tokens=True) if tok else None
        finish = "cache" if seq.finish == "length" and seq.cache_bound else seq.finish
        return Output(seq.generated, text, seq.stats, finish, seq.prompt_ids)

    def steps(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        stop_strings: Sequence[str] = (),
        eos_token_ids: Sequence[int] | None = None,
        seed: int | None = None,
        request_id: Hashable | None = None,
    ) -> Generator[list[int], None, Output]:
        """Yield the tokens committed by each step; the generator's return value is the `Output`.
        ``request_id`` names the request served (e.g. a benchmark question), for drafters that
        learn across requests (`DecodeState.request_id`). A batch of one through `_run`."""
        run = self._run([self._request(prompt, max_new_tokens, stop_strings, eos_token_ids, seed, request_id)], 1)
        while True:
            try:
                _, chunk = next(run)
            except StopIteration as done:
                return done.value[0]
            yield chunk

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 128,
        stop_strings: Sequence[str] = (),
        eos_token_ids: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
        batch_size: int | None = None,
        request_ids: Sequence[Hashable] | None = None,
        on_done: Callable[[int, Output], None] | None = None,
    ) -> list[Output]:
        """Decode every prompt, ``batch_size`` at a time (default: all at once), one `Output`
        per prompt in order, each with its own stats. Request i draws from its own generator
        seeded ``seeds[i]`` (default: the decoder's seed), so its output is exactly what
        `generate` gives it alone with that seed, whichever requests share its batch (see
        docs/batching.md; `slots` says how many decode at once). ``on_done(i, output)`` is
        called as each request finishes (to save it at once: `spec_zoo.batch_run`)."""
        n = len(prompts)
        if batch_size is None:
            batch_size = max(n, 1)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size: {batch_size!r} is not a positive integer; pass e.g. 8.")
        for name, values in (("seeds", seeds), ("request_ids", request_ids)):
            if values is not None and len(values) != n:
                raise ConfigError(f"{name}: {len(values)} given for {n} prompts; pass one per prompt.")
        requests = [
            self._request(p, max_new_tokens, stop_strings, eos_token_ids,
                          None if seeds is None else seeds[i], None if request_ids is None else request_ids[i])
            for i, p in enumerate(prompts)
        ]
        run = self._run(requests, batch_size, on_done)
        while True:
            try:
                next(run)
            except StopIteration as done:
                return done.value

    def _cut_at_stop(self, generated: list[int], step: list[int], stop_strings: Sequence[str]):
        """Cut ``step`` just after the token that completes a stop string, if any does.

        A stop string completed now ends in ``step`` and starts at most its length before it,
        so only a tail of ``generated`` is decoded with it: the shortest whose text is at least
        the longest stop string, plus one token (a token decoded alone may lose a leading space
        or half a character). The work per step is bounded by the stop strings, not the output."""
        tok = self._tokenizer()
        longest, start = max(map(len, stop_strings)), len(generated)
        while start > 0 and len(tok.decode(generated[start:], skip_special_tokens=True)) < longest:
            start -= 1
        tail = generated[max(start - 1, 0):]
        for k in range(1, len(step) + 1):
            text = tok.decode(tail + step[:k], skip_special_tokens=True)
            if any(s in text for s in stop_strings):
                return step[:k], True
        return step, False

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        stop_strings: Sequence[str] = (),
        eos_token_ids: Sequence[int] | None = None,
        seed: int | None = None,
        on_text: Callable[[str], None] | None = None,
        request_id: Hashable | None = None,
    ) -> Output:
        """Decode to the end; ``on_text`` receives each new piece of text as it is committed."""
        run = self.steps(prompt, max_new_tokens, stop_strings, eos_token_ids, seed, request_id)
        printer = _TextStreamer(self.target.tokenizer, on_text) if on_text else None
        while True:
            try:
                chunk = next(run)
            except StopIteration as done:
                if printer:
                    printer.flush()
                return done.value
            if printer:
                printer.push(chunk)

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[str]:
        """Yield text pieces as they are committed (needs a tokenizer)."""
        pieces: list[str] = []
        run = self.steps(prompt, **kwargs)
        printer = _TextStreamer(self._tokenizer(), pieces.append)
        for chunk in run:
            printer.push(chunk)
            yield from pieces
            pieces.clear()
        printer.flush()
        yield from pieces


def refuse_empty(prompt: str | Sequence[int]) -> None:
    """An empty prompt (blank text, no token ids) leaves nothing to continue: refused."""
    if isinstance(prompt, str) and not prompt.strip():
        raise ConfigError("prompt: it is empty; pass some text, e.g. prompt='Tell me about bees'.")
    if not isinstance(prompt, str) and len(prompt) == 0:
        raise ConfigError("prompt: it is empty; pass at least one token id.")


def _warn_chat_markers(prompt: str, tokenizer) -> None:
    """Special tokens typed into a chat prompt become real turn markers once templated:
    say so, since the model then sees a conversation the user may not have meant."""
    markers = [t for t in getattr(tokenizer, "all_special_tokens", []) if len(t) > 1 and t in prompt]
    if markers:
        print(
            f"warning: prompt contains the special token(s) {', '.join(markers)}; with generation.chat=true "
            "they act as chat turn markers. Set generation.chat=false to pass the text as is.",
            file=sys.stderr,
        )


class _TextStreamer:
    """Turns committed token chunks into text deltas, holding back incomplete characters.

    Incremental, as vLLM's detokenizer is: each push decodes only the tokens since the last
    emitted text plus the few before them (``prefix``: the context a token's text depends on,
    e.g. a leading space), and emits what that adds; the work per push does not grow with
    the output."""

    def __init__(self, tokenizer, emit: Callable[[str], None]):
        self.tokenizer, self.emit = tokenizer, emit
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] were emitted already; ids[read:] not yet

    def _delta(self) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        return decode(self.ids[self.prefix :], skip_special_tokens=True)[len(before) :]

    def push(self, chunk: list[int]) -> None:
        self.ids += chunk
        delta = self._delta()
        if not delta or delta.endswith("\ufffd"):  # nothing yet, or a multi-byte character still incomplete
            return
        self.emit(delta)
        self.prefix, self.read = self.read, len(self.ids)

    def flush(self) -> None:
        if delta := self._delta():
            self.emit(delta)
        self.prefix = self.read = len(self.ids)
