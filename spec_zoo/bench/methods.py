"""Benchmark engines: spec-zoo decoders and transformers reference implementations behind
one small interface (`Method.run(prompt_ids, max_new_tokens, seed, request_id) -> Measurement`),
and `build_method`, which turns a resolved `spec_zoo.bench.specs.MethodSpec` into one on a
loaded target.

Drafters and verifiers are built with ``hydra.utils.instantiate``, like the main CLI, so a
user's own drafter (``_target_: my_pkg.MyDrafter``) is benchmarked with no edit here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf

from spec_zoo.auto import AutoChoice, choose
from spec_zoo.batch_policy import BatchPolicy
from spec_zoo.bench.peers import PEERS
from spec_zoo.bench.records import BASELINE
from spec_zoo.bench.specs import MethodSpec
from spec_zoo.bench.trace import StepTrace
from spec_zoo.costs import cached_table
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.registry import build_component
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams
from spec_zoo.stats import RunStats

if TYPE_CHECKING:
    from transformers import StaticCache


@dataclass
class Measurement:
    """What one timed generation gives: the output and the contract's measurement fields."""

    output_ids: list[int]
    fields: dict  # prompt_tokens, new_tokens, wall_s, tokens_per_s, target_forwards, tau, alpha, ...
    trace: dict | None = None  # per-step columns (`StepTrace.columns`) of a spec-zoo decoder


class Method(ABC):
    """A named way to generate, timed by the benchmark; ``plain`` names the method that is its own
    plain decoding (its output is compared with that one's, `spec_zoo.bench.specs.with_plains`)."""

    plain: str = BASELINE
    dtype: str | None = None  # the target's weights as this method computes with them

    def __init__(self, name: str, drafter: str, verifier: str, params: dict, config_hash: str):
        self.name, self.drafter, self.verifier = name, drafter, verifier
        self.params, self.config_hash = params, config_hash

    @abstractmethod
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int,
            request_id: Hashable | None = None) -> Measurement:
        """Generate after ``prompt_ids`` (EOS included in the output when hit); ``request_id``
        names the question served (drafters that learn across requests hide its earlier output)."""

    def run_batch(self, prompts: Sequence[list[int]], max_new_tokens: int, seed: int,
                  request_ids: Sequence[Hashable], batch_size: int) -> list[Measurement]:
        """Generate after each prompt, up to ``batch_size`` at once; one `Measurement` per prompt.
        An engine that cannot decode requests side by side runs them one after another (this
        default): its throughput at a batch size is then its throughput alone."""
        return [self.run(p, max_new_tokens, seed, r) for p, r in zip(prompts, request_ids, strict=True)]


class SpecZooMethod(Method):
    """A `SpeculativeDecoder` (plain decoding when its drafter is ``none``)."""

    def __init__(self, name, decoder: SpeculativeDecoder, params, config_hash,
                 drafter: str | None = None, stop_strings: Sequence[str] = (), eos_token_ids=None):
        super().__init__(name, drafter or decoder.drafter.name, decoder.verifier.name, params, config_hash)
        self.decoder, self.stop_strings, self.eos_token_ids = decoder, tuple(stop_strings), eos_token_ids
        self.dtype = str(decoder.target.dtype).removeprefix("torch.")

    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        with StepTrace(self.decoder) as trace:
            out = self.decoder.generate(prompt_ids, max_new_tokens, self.stop_strings, self.eos_token_ids, seed,
                                        request_id=request_id)
        return Measurement(out.ids, _fields(out.stats, trace.predicted_speedup), trace.columns(out.stats))

    def run_batch(self, prompts, max_new_tokens, seed, request_ids, batch_size):
        """`SpeculativeDecoder.generate_batch`: the requests side by side where the drafter keeps
        per-sequence state (`SpeculativeDecoder.slots`); per-step traces only for one at a time
        (an observer cannot tell a batch's sequences apart)."""
        if batch_size == 1:
            return super().run_batch(prompts, max_new_tokens, seed, request_ids, batch_size)
        outs = self.decoder.generate_batch(prompts, max_new_tokens, self.stop_strings, self.eos_token_ids,
                                           [seed] * len(prompts), batch_size, request_ids)
        return [Measurement(out.ids, _fields(out.stats, None)) for out in outs]


def _fields(stats: RunStats, predicted_speedup: float | None) -> dict:
    """A spec-zoo decoder's measurement fields of one request."""
    return {**stats.as_dict(), "drafted": stats.drafted, "accepted": stats.accepted,
            "predicted_speedup": predicted_speedup}


class TransformersMethod(Method):
    """``model.generate`` with the same length, sampling and EOS as the spec-zoo methods:
    plain, prompt lookup (``prompt_lookup_num_tokens``) or assisted (``assistant_model``).
    It exposes no per-step counts, so tau, alpha and target_forwards are null."""

    def __init__(self, name, model, sampling: SamplingParams, config_hash, drafter="none",
                 generate_kwargs: Mapping | None = None, params: dict | None = None,
                 eos_token_ids: Sequence[int] | None = None, stop_strings: Sequence[str] = (), tokenizer=None):
        params = dict(generate_kwargs or {}) if params is None else params
        super().__init__(name, drafter, "transformers", params, config_hash)
        self.model = model
        self.dtype = str(model.dtype).removeprefix("torch.")
        self.kwargs: dict[str, Any] = {"do_sample": not sampling.greedy}
        if eos_token_ids:  # else generate() falls back to the model's generation_config
            eos = sorted(eos_token_ids)
            self.kwargs.update(eos_token_id=eos, pad_token_id=eos[0])
        if not sampling.greedy:
            self.kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        if stop_strings:
            self.kwargs.update(stop_strings=list(stop_strings), tokenizer=tokenizer)
        self.kwargs.update(generate_kwargs or {})
        self.cache: StaticCache | None = None
        if self.kwargs.get("cache_implementation") == "static":
            self._compile_static()

    def _compile_static(self, max_cache_len: int = 2048) -> None:
        """transformers' documented fast path: a static cache and the model's forward compiled
        (on a copy, so the other methods keep the eager model). generate() would size a new
        cache per prompt (a recompile each); one cache of ``max_cache_len`` is reused instead.
        Two untimed generations with prompts of different lengths compile the prefill's
        dynamic-shape graph and the one-token graph before anything is measured."""
        import copy

        from transformers import StaticCache

        self.kwargs.pop("cache_implementation")
        self.model = copy.deepcopy(self.model)
        self.model.forward = torch.compile(self.model.forward, mode="reduce-overhead", fullgraph=True)
        self.cache = StaticCache(config=self.model.config, max_cache_len=max_cache_len)
        start = time.perf_counter()
        for length in (5, 9):
            self.run(list(range(3, 3 + length)), 4, 0)
        self.compile_s = time.perf_counter() - start

    @torch.no_grad()
    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=self.model.device)
        extra = {}
        if self.cache is not None:
            self.cache.reset()
            extra["cache"] = self.cache
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, **self.kwargs, **extra
        )
        wall = time.perf_counter() - start
        new = out[0, len(prompt_ids):].tolist()
        fields = {
            "prompt_tokens": len(prompt_ids), "new_tokens": len(new), "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else 0.0,
            "target_forwards": None, "tau": None, "alpha": None, "drafted": None, "accepted": None,
            "draft_s": None, "verify_s": None, "accept_per_position": None, "predicted_speedup": None,
        }
        return Measurement(new, fields)


def build_method(spec: MethodSpec, target: Target, sampling: SamplingParams, config_hash: str, seed: int = 0,
                 stop_strings: Sequence[str] = (), eos_token_ids: Sequence[int] | None = None,
                 batch_policy: BatchPolicy | None = None) -> Method:
    """Instantiate a resolved spec on a loaded target (loads draft/assistant models); a peer
    engine's is `spec_zoo.bench.peer_method.build_peer_method`. ``batch_policy``: how a spec-zoo
    method cuts its drafts in a batch (`spec_zoo.batch_policy`)."""
    if spec.engine in PEERS:
        raise ValueError(f"method {spec.name}: a peer engine's method is built by build_peer_method")
    method = _built(spec, target, sampling, config_hash, seed, stop_strings, eos_token_ids, batch_policy)
    method.plain = spec.plain
    return method


def _built(spec: MethodSpec, target: Target, sampling: SamplingParams, config_hash: str, seed: int,
           stop_strings: Sequence[str], eos_token_ids: Sequence[int] | None,
           batch_policy: BatchPolicy | None) -> Method:
    if spec.engine == "spec_zoo":
        key = f"methods.{spec.name}"
        drafter = build_component(OmegaConf.create(spec.drafter), f"{key}.drafter")
        verifier = build_component(OmegaConf.create(spec.verifier), f"{key}.verifier") if spec.verifier else None

        def decoder_of(drafter) -> SpeculativeDecoder:
            return SpeculativeDecoder(target, drafter, verifier, sampling, seed, cost_table=cached_table(target),
                                      batch_policy=batch_policy)

        if isinstance(drafter, AutoChoice):  # one more method: chosen on its workload, then run as named
            encode = SpeculativeDecoder(target, sampling=sampling).encode
            auto = drafter

            def candidate(option: str) -> SpeculativeDecoder:
                return decoder_of(build_component(auto.option(option), key))

            name = choose(auto, target, (), encode, candidate, sampling.temperature)
            drafter = build_component(auto.option(name), f"{key}.drafter")
        decoder = decoder_of(drafter)
        return SpecZooMethod(spec.name, decoder, spec.record_params, config_hash,
                             spec.drafter_label, stop_strings, eos_token_ids)
    kwargs = dict(spec.params)
    if spec.assistant:
        from spec_zoo.models import load_causal_lm, other_vocabulary, truncated_draft

        a = spec.assistant
        path = a.get("path") or truncated_draft(int(a["draft_layers"]))
        kwargs["assistant_model"], theirs = load_causal_lm(path, a.get("dtype", "float32"), a.get("device", "cpu"))
        if other_vocabulary(theirs, target.tokenizer):
            # another vocabulary: transformers' universal assisted generation, which re-tokenizes through text
            kwargs.update(assistant_tokenizer=theirs, tokenizer=target.tokenizer)
    return TransformersMethod(spec.name, target.model, sampling, config_hash, spec.drafter_label, kwargs,
                              spec.record_params, eos_token_ids, stop_strings, target.tokenizer)
