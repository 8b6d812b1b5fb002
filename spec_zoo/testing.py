"""Losslessness checks for drafters and verifiers, for spec-zoo's own tests and yours.

A drafter is lossless under an exact verifier when (1) at temperature 0 the output is
token for token the target's plain greedy decoding, and (2) at temperature > 0 the
generated tokens follow the target's sampling distribution. Both are checked on tiny
random Llama models, built here, in seconds on a CPU::

    from spec_zoo.testing import assert_greedy_identity, assert_lossless

    def test_my_drafter_is_lossless():
        assert_greedy_identity(lambda model: MyDrafter())
        assert_lossless(lambda model: MyDrafter())

`assert_lossless` is a proof for its tiny model: `certify` enumerates every random choice
of the decode and compares the exact law of the generated tokens with the target's
(docs/certify.md). The chi-square check `assert_sampling_exact` remains for models too
large to enumerate (it needs scipy: ``pip install scipy``, part of spec-zoo's ``dev``
extra). A factory receives the target model (a ``transformers`` Llama), so a drafter that
needs one (a draft model, a head) can be built from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from spec_zoo.certify import Certificate, certify
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.interfaces import Drafter, Verifier
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import SamplingParams, logits_to_probs

DrafterFactory = Callable[[torch.nn.Module], Drafter]

# the sampling check: the exact joint distribution of LENGTH tokens over a VOCAB-token model
VOCAB, LENGTH, SAMPLES = 8, 3, 2000
PROMPT = [2, 3, 4, 2, 3, 4, 2, 3]  # repetitive, so prompt-lookup drafters propose
P_MIN = 1e-3  # a correct rule fails with this probability per check
SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7_topk5_topp0.9": SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
}


# the enumerated check: a 4-token model, 3 tokens after a repetitive prompt (certify)
CERTIFY_VOCAB, CERTIFY_LENGTH, CERTIFY_PROMPT = 4, 3, [2, 3, 2, 3, 2]
CERTIFY_SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7_topk3_topp0.75": SamplingParams(temperature=0.7, top_k=3, top_p=0.75),
}
MAX_TV = 1e-9  # lossless: the exact laws agree up to float64 rounding


def tiny_llama(seed: int = 0, vocab: int = 64, layers: int = 2, sharpness: float = 1.0, dtype=torch.float64, **config):
    """A random Llama; ``sharpness`` scales the LM head so next-token distributions are
    peaked (random init alone gives nearly uniform ones, which hide broken rules);
    ``config`` overrides any LlamaConfig field (e.g. max_position_embeddings=16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    fields.update(config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**fields)).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


# tiny random configs of the families spec-zoo serves (`tiny_family`): the config class and
# what the family needs on top of the shared sizes; sliding windows are SHORTER than the
# test sequences, soft-capping is on where the family has it
WINDOW = 8
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": WINDOW, "final_logit_softcapping": 2.0,
                                "attn_logit_softcapping": 1.0, "query_pre_attn_scalar": 16}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": WINDOW, "final_logit_softcapping": 2.0,
                                    "layer_types": ["sliding_attention", "full_attention"] * 2,
                                    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                        "sliding_attention": {"rope_type": "default",
                                                                              "rope_theta": 1e4}}}),
    "phi3": ("Phi3Config", {"sliding_window": WINDOW, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXConfig", {}),
    "gpt2": ("GPT2Config", {}),
    "olmo2": ("Olmo2Config", {}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "shared_expert_intermediate_size": 32, "experts_implementation": "eager"}),
}


def tiny_family(family: str, seed: int = 0, vocab: int = 64, layers: int = 2, sharpness: float = 3.0,
                dtype=torch.float64, **config):
    """A random model of ``family`` (a key of FAMILIES): hidden 64, ``layers`` layers, as
    `tiny_llama` otherwise (``sharpness`` scales the LM head, and query and key projections are
    scaled so attention is peaked; generation never stops at EOS; ``config`` overrides any
    field of the family's config)."""
    import transformers

    name, extra = FAMILIES[family]
    fields: dict[str, Any] = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    fields.update(extra)
    fields.update(config)
    if "layer_types" in fields:
        fields["layer_types"] = fields["layer_types"][:layers]
    config = getattr(transformers, name)(**fields)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpness)
        for name, weight in model.named_parameters():  # peaked attention: windows and soft-caps then matter
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(5.0)
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """Reference: transformers' own greedy decoding."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def repetitive_prompt(seed: int, vocab: int = 64) -> list[int]:
    """A motif repeated three times plus a random tail, so prompt lookup finds matches."""
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(2, vocab, (5,), generator=gen).tolist()
    return motif * 3 + torch.randint(2, vocab, (4,), generator=gen).tolist()


def _verifiers() -> list[Verifier]:
    from spec_zoo.verifiers.greedy import GreedyVerifier
    from spec_zoo.verifiers.rejection import RejectionVerifier

    return [GreedyVerifier(), RejectionVerifier()]


def assert_greedy_identity(
    drafter_factory: DrafterFactory,
    seeds: Sequence[int] = (0, 1, 2),
    max_new_tokens: int = 40,
    verifiers: Sequence[Verifier] | None = None,
) -> None:
    """At temperature 0, decoding with the drafter must reproduce transformers' greedy
    decoding token for token, on one float64 tiny model per seed (no near-ties), with
    each verifier (default: greedy and rejection). Raises AssertionError at the first
    differing token."""
    for seed in seeds:
        model = tiny_llama(seed, sharpness=3.0)
        prompt = repetitive_prompt(seed)
        reference = hf_greedy(model, prompt, max_new_tokens)
        for verifier in verifiers or _verifiers():
            decoder = SpeculativeDecoder(Target(model), drafter_factory(model), verifier, SamplingParams())
            ids = decoder.generate(prompt, max_new_tokens=max_new_tokens, eos_token_ids=[]).ids
            if ids != reference:
                at = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), min(len(ids), len(reference)))
                raise AssertionError(
                    f"seed {seed}, verifier={verifier.name}: output differs from plain greedy decoding at "
                    f"token {at} (got {ids[at:at + 5]}..., expected {reference[at:at + 5]}...)")


def sampling_model(seed: int = 21):
    """The model of the sampling check: VOCAB tokens, peaked distributions."""
    return tiny_llama(seed, vocab=VOCAB, sharpness=6.0)


def exact_distribution(model, sampling: SamplingParams) -> torch.Tensor:
    """P(x1, x2, x3 | PROMPT) under the target, as a flat [VOCAB**3] vector."""
    with torch.no_grad():
        p1 = logits_to_probs(model(torch.tensor([PROMPT])).logits[0, -1], sampling)
        pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
        ids = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], 1)
        logits = model(ids).logits
        p2 = logits_to_probs(logits[::VOCAB, -2], sampling)  # after x1 (same for every x2)
        p3 = logits_to_probs(logits[:, -1], sampling)  # after (x1, x2)
    joint = p1[:, None, None] * p2[:, :, None] * p3.reshape(VOCAB, VOCAB, VOCAB)
    return joint.reshape(-1)


def sample_counts(decoder: SpeculativeDecoder, samples: int = SAMPLES) -> torch.Tensor:
    """How often each of the VOCAB**3 continuations of PROMPT is generated, one seed per sample."""
    counts = torch.zeros(VOCAB**LENGTH)
    for seed in range(samples):
        ids = decoder.generate(PROMPT, max_new_tokens=LENGTH, eos_token_ids=[], seed=seed).ids
        counts[(ids[0] * VOCAB + ids[1]) * VOCAB + ids[2]] += 1
    return counts


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value, pooling cells expected below 5 into one (when there are any)."""
    try:
        from scipy.stats import chisquare
    except ImportError:
        raise ImportError("spec_zoo.testing's sampling check needs scipy: pip install scipy "
                          "(or spec-zoo's dev extra: pip install 'spec-zoo[dev]').") from None
    expected = probs.double() * counts.sum()
    big = expected >= 5
    obs, exp = counts[big].double(), expected[big]
    if not big.all():
        obs = torch.cat([obs, counts[~big].sum().reshape(1).double()])
        exp = torch.cat([exp, expected[~big].sum().reshape(1)])
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def sampling_pvalue(model, drafter: Drafter, sampling: SamplingParams, verifier: Verifier | None = None,
                    samples: int = SAMPLES) -> tuple[float, SpeculativeDecoder]:
    """(chi-square p-value of ``samples`` generations against the exact distribution, the decoder)."""
    from spec_zoo.verifiers.rejection import RejectionVerifier

    decoder = SpeculativeDecoder(Target(model), drafter, verifier or RejectionVerifier(), sampling)
    counts = sample_counts(decoder, samples)
    return goodness_of_fit(counts, exact_distribution(model, sampling)), decoder


def assert_sampling_exact(
    drafter_factory: DrafterFactory,
    sampling: SamplingParams = SETTINGS["t1"],
    verifier: Verifier | None = None,
    samples: int = SAMPLES,
    p_min: float = P_MIN,
) -> float:
    """At temperature > 0, the first LENGTH tokens generated with the drafter (default
    verifier: rejection) must follow the target's exact joint distribution: a chi-square
    test over ``samples`` seeded runs, failing when p < ``p_min`` (a correct drafter
    fails with probability ``p_min``; the same test catches an accept-everything rule and
    a rule that skips the residual). Returns the p-value."""
    model = sampling_model()
    pvalue, _ = sampling_pvalue(model, drafter_factory(model), sampling, verifier, samples)
    if pvalue < p_min:
        raise AssertionError(f"sampled tokens do not follow the target's distribution (chi-square p={pvalue:.2g} "
                             f"< {p_min}, {samples} samples at {sampling}): the drafter's Draft.probs are "
                             "not the distributions its tokens were drawn from, or drafts depend on the verifier")
    return pvalue


def certify_model(seed: int = 21):
    """The model of the enumerated check: CERTIFY_VOCAB tokens, peaked distributions."""
    return tiny_llama(seed, vocab=CERTIFY_VOCAB, sharpness=6.0)


def assert_lossless(
    drafter_factory: DrafterFactory,
    verifier: Verifier | None = None,
    sampling: SamplingParams = CERTIFY_SETTINGS["t1"],
    model=None,
    length: int = CERTIFY_LENGTH,
    prompt: Sequence[int] = CERTIFY_PROMPT,
    max_tv: float = MAX_TV,
) -> Certificate:
    """The first ``length`` tokens generated with the drafter (default verifier: rejection)
    follow the target's law exactly: `certify` on ``model`` (default `certify_model`),
    failing when the total variation exceeds ``max_tv``. Returns the certificate (its exact
    tau, the law itself)."""
    from spec_zoo.verifiers.rejection import RejectionVerifier

    model = certify_model() if model is None else model
    cert = certify(lambda: model, drafter_factory, verifier or RejectionVerifier(), sampling, prompt, length)
    if cert.tv > max_tv:
        worst = max(cert.target.keys() | cert.law.keys(),
                    key=lambda x: abs(cert.law.get(x, 0.0) - cert.target.get(x, 0.0)))
        raise AssertionError(
            f"generated tokens do not follow the target's law: exact total variation {cert.tv:.3g} > {max_tv:g} "
            f"at {sampling} (worst: {list(worst)} has probability {cert.law.get(worst, 0.0):.6f}, the target's "
            f"{cert.target.get(worst, 0.0):.6f}): the drafter's Draft.probs are not the distributions its tokens "
            "were drawn from, or the verifier is not exact")
    return cert
