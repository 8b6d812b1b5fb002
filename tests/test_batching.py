"""A batch of requests (`SpeculativeDecoder.generate_batch`): each request's output is exactly
its output decoded alone, at every batch size, for every drafter (docs/batching.md)."""

import pytest

import spec_zoo
from spec_zoo import SamplingParams, SpeculativeDecoder, Target
from spec_zoo.drafters.ngram import NgramDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.testing import repetitive_prompt, tiny_family
from tests.drafts import drafter_lineup
from tests.tiny import one_thread, tiny_llama  # noqa: F401 (autouse fixture)

MAX_NEW = 8
SIZES = [1, 2, 3, 8, 16]
# 16 requests of mixed lengths (5..20 tokens), continuing different repetitive prompts
PROMPTS = [repetitive_prompt(i)[: 5 + i] for i in range(16)]


def _alone(model, prompts, eos):
    """Reference: plain decoding, one request at a time on a fresh decoder each."""
    return [SpeculativeDecoder(Target(model)).generate(p, MAX_NEW, eos_token_ids=eos).ids for p in prompts]


@pytest.fixture(scope="module")
def case():
    model = tiny_llama(0, sharpness=3.0)
    free = _alone(model, PROMPTS, [])
    eos = [free[0][3]]  # a token some requests emit early: they end by eos, the others by length
    return model, eos, _alone(model, PROMPTS, eos)


@pytest.mark.parametrize("drafter", list(drafter_lineup(tiny_llama(0))))
def test_each_request_equals_its_batch_1_output(case, drafter):
    model, eos, reference = case
    assert any(len(r) < MAX_NEW for r in reference) and any(len(r) == MAX_NEW for r in reference)
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter]())
    for size in SIZES:
        assert decoder.slots(size) == size  # every shipped drafter interleaves its requests
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=size)
        assert [o.ids for o in outs] == reference, f"batch_size={size}"
        assert [o.stats.new_tokens for o in outs] == [len(r) for r in reference]
        assert [o.prompt_ids for o in outs] == PROMPTS


def _drafts(outputs) -> list[list[tuple[int, int]]]:
    """Each request's steps as (nodes drafted, nodes accepted): what its drafter proposed."""
    return [[(step.drafted, step.accepted) for step in out.stats.steps] for out in outputs]


# drafters whose drafts follow the tokens alone (no learned cost, no clock): a fork must draft them exactly
STEADY = ["ngram_k1", "small_chain_k3", "small_tree_2x3", "early_exit_k3", "early_exit_adapter_no_reuse",
          "eagle_k3", "eagle_tree_dynamic", "medusa_tree", "parallel_k3", "merge_ngram_small"]


@pytest.mark.parametrize("drafter", STEADY)
def test_each_request_drafts_as_it_does_alone(case, drafter):
    """A sequence's drafter state is its own: its draft model's cache entry, its head's cache, its
    features. Every step drafts and accepts what the request does decoded alone, at every batch size
    (a drafter reading its neighbour's cache would still give the right output, lossless as the
    verification is, but not these drafts)."""
    model, eos, reference = case
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter]())
    alone = _drafts(decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=1))
    assert any(accepted for steps in alone for _, accepted in steps)
    for size in SIZES[1:]:
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=size)
        assert [o.ids for o in outs] == reference and _drafts(outs) == alone, f"batch_size={size}"


def test_a_draft_model_keeps_each_sequences_cache(case, monkeypatch):
    """The draft model holds a cache entry per sequence, so in a batch it reads each request's
    tokens once, as alone. Planted fault: the forks share one cache (no swap: the draft model
    scores each ask on whatever sequence it holds); it follows whichever sequence drafted last, so
    every draft re-reads its prompt (same drafts, many more tokens)."""
    from spec_zoo.drafters.small_model import DraftModelSequences

    model, eos, reference = case
    decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)["small_chain_k3"]())
    runner, fed = decoder.drafter.runner, []
    forward = runner._forward
    monkeypatch.setattr(runner, "_forward", lambda new, *rest: fed.append(len(new)) or forward(new, *rest))

    def tokens_read(size: int) -> int:
        fed.clear()
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=size)
        assert [o.ids for o in outs] == reference
        return sum(fed)

    alone = tokens_read(1)
    assert tokens_read(8) == alone
    monkeypatch.setattr(DraftModelSequences, "propose", lambda self, state: self._draft(state))
    monkeypatch.setattr(Target, "together", lambda self, asks: [self.score(ask.tokens, ask.draft).logits
                                                                for ask in asks])
    assert tokens_read(8) > 2 * alone


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
def test_other_families(family):
    model = tiny_family(family)
    reference = _alone(model, PROMPTS[:6], [])
    decoder = SpeculativeDecoder(Target(model), NgramDrafter(branches=2))
    assert decoder.slots(3) == 3  # the ngram drafter and the eager target interleave requests
    assert [o.ids for o in decoder.generate_batch(PROMPTS[:6], MAX_NEW, eos_token_ids=[], batch_size=3)] == reference


@pytest.mark.parametrize("branches", [1, 2], ids=["chain", "tree"])
def test_sampled_batch_of_2_equals_each_request_alone(branches):
    model = tiny_llama(0)
    sampling = SamplingParams(temperature=1.0)
    prompts, seeds = PROMPTS[3:5], [11, 12]

    def decoder():
        return SpeculativeDecoder(Target(model), NgramDrafter(branches=branches), sampling=sampling)

    alone = [decoder().generate(p, 16, eos_token_ids=[], seed=s).ids for p, s in zip(prompts, seeds, strict=True)]
    batched = decoder()
    assert batched.slots(2) == 2
    outs = batched.generate_batch(prompts, 16, eos_token_ids=[], seeds=seeds, batch_size=2)
    assert [o.ids for o in outs] == alone
    assert alone[0] != alone[1]


def test_bad_batch_arguments_are_refused_before_decoding(case):
    model, _, _ = case
    decoder = SpeculativeDecoder(Target(model))
    with pytest.raises(ConfigError, match="batch_size"):
        decoder.generate_batch(PROMPTS, batch_size=0)
    with pytest.raises(ConfigError, match="seeds: 1 given for 2 prompts"):
        decoder.generate_batch(PROMPTS[:2], seeds=[1])
    with pytest.raises(ConfigError, match="empty"):
        decoder.generate_batch([PROMPTS[0], []])


def test_the_one_call_api_takes_a_list_of_prompts(case):
    model, _, _ = case
    target = Target(model)
    outs = spec_zoo.generate(PROMPTS[:3], drafter="ngram", model=target, max_new_tokens=MAX_NEW, batch_size=2)
    alone = [spec_zoo.generate(p, drafter="ngram", model=target, max_new_tokens=MAX_NEW) for p in PROMPTS[:3]]
    assert isinstance(outs, list) and [o.ids for o in outs] == [o.ids for o in alone]


# -- draft depths in a batch (spec_zoo.batch_policy) ---------------------------------------------------
def _table(seconds):
    from spec_zoo.costs import CostTable

    return CostTable(list(seconds), "m", "eager", "float32", 1, "test")


def _chains(*depths):
    import torch

    from spec_zoo.draft import Draft

    return [Draft.chain(torch.arange(d)) if d else Draft.empty() for d in depths]


def test_goodput_scores_the_levels_that_pay_for_their_rows():
    from spec_zoo.batch_policy import Goodput

    flat_to_8 = _table([1.0] * 8 + [2.0] * 24)
    # 4 rows are free beyond the 2 committed tokens' rows: the likelier sequence takes them all
    assert Goodput().depths(_chains(8, 8), [0.9, 0.3], flat_to_8) == [6, 0]
    assert Goodput().depths(_chains(8, 8), [0.9, 0.9], flat_to_8) == [3, 3]
    # every row dearer than the step it might save: nothing is drafted
    linear = _table([float(m) for m in range(1, 65)])
    assert Goodput().depths(_chains(8, 8, 8, 8), [0.95] * 4, linear) == [0, 0, 0, 0]
    # never deeper than proposed; alone or without a table the drafter's own choice stands
    assert Goodput().depths(_chains(2, 0), [0.9, 0.9], flat_to_8) == [2, 0]
    assert Goodput().depths(_chains(8), [0.1], linear) == [8]
    assert Goodput().depths(_chains(8, 8), [0.1, 0.1], None) == [8, 8]


def test_before_drafting_goodput_weighs_what_drafting_costs_too():
    from spec_zoo.batch_policy import Goodput

    flat_to_8 = _table([1.0] * 8 + [2.0] * 24)
    # the six free rows as in the test above, when drafting is free or cheap
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8) == [3, 3]
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8, [0.2, 0.2]) == [3, 3]
    # a level costing half a target step to draft never pays for a 0.9 chance of a token
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8, [0.5, 0.5]) == [0, 0]
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8, [0.0, 0.5]) == [6, 0]
    # drafting together, the two share each level's call: half a step a level, paid once, pays for
    # both sequences' tokens where paid twice it did not
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8, [0.5, 0.5], [True, True]) == [3, 3]
    assert Goodput().bounds([8, 8], [0.9, 0.9], flat_to_8, [0.2, 0.2], [True, True]) == [3, 3]
    # a sequence given every priced level is not bounded; without a table none is
    assert Goodput().bounds([40, 40], [1.0, 1.0], _table([1.0] * 64)) == [40, 40]
    assert Goodput().bounds([30, 30], [0.1, 0.1], None) == [30, 30]


def test_a_schedule_caps_by_the_number_of_live_sequences():
    from spec_zoo.batch_policy import Schedule, batch_policy

    schedule = Schedule({1: 8, 4: 4, 8: 0})
    assert schedule.depths(_chains(6, 6, 6), [0.9] * 3, None) == [6, 6, 6]
    assert schedule.depths(_chains(6, 2, 6, 6, 6), [0.9] * 5, None) == [4, 2, 4, 4, 4]
    assert schedule.depths(_chains(*[6] * 9), [0.9] * 9, None) == [0] * 9
    assert batch_policy("drafter") is None
    for bad in ["fastest", {0: 4}, {"x": 4}, {4: -1}]:
        with pytest.raises(ConfigError, match="batch_policy"):
            batch_policy(bad)


@pytest.mark.parametrize("policy", ["goodput", "schedule"])
def test_a_batch_policy_cuts_drafts_never_outputs(case, policy):
    """With a cost curve on which long drafts do not pay, the policy scores fewer rows than the
    drafter proposed, and every request's greedy output is still its batch-1 output."""
    from spec_zoo.batch_policy import Goodput, Schedule

    model, eos, reference = case
    rule = Goodput() if policy == "goodput" else Schedule({1: 8, 4: 1})
    steep = _table([1.0, 1.2] + [1.0 + 0.6 * m for m in range(2, 64)])
    rows = {}
    for name, chosen in (("proposed", None), ("cut", rule)):
        decoder = SpeculativeDecoder(Target(model), NgramDrafter(num_draft=6, adaptive=False), cost_table=steep,
                                     batch_policy=chosen)
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=8)
        assert [o.ids for o in outs] == reference
        rows[name] = sum(s.drafted for o in outs for s in o.stats.steps)
    assert rows["cut"] < rows["proposed"]


@pytest.mark.parametrize("drafter", ["small_chain_k3", "eagle_k3", "cascade_ngram_eagle"])
def test_the_policy_bounds_each_draft_before_it_is_made(case, drafter, monkeypatch):
    """On a cost curve where long drafts do not pay, the policy bounds each sequence's draft before
    the drafter makes it (`BatchPolicy.bounds`), so draft models and heads run fewer forwards than
    when the drafts are only cut afterwards; a drafter bounded to nothing for some steps is still
    asked (EAGLE keeps every target feature), and every output is its batch-1 output."""
    from spec_zoo.batch_policy import Goodput
    from spec_zoo.drafters.eagle.drafter import EagleDrafter
    from spec_zoo.runtime.target import Target as Runner

    model, eos, reference = case
    steep = _table([1.0, 1.2] + [1.0 + 0.6 * m for m in range(2, 64)])
    calls = []
    for cls, name in ((EagleDrafter, "_head"), (Runner, "_forward")):  # a head's forwards, a draft model's
        honest = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, honest=honest, **k: calls.append(1) or honest(self, *a, **k))
    forwards = {}
    for name, policy in (("cut after", None), ("bounded", Goodput())):
        decoder = SpeculativeDecoder(Target(model), drafter_lineup(model)[drafter](), cost_table=steep,
                                     batch_policy=policy)
        if policy is None:  # the same cut, made after drafting: every drafter drafts what it likes
            monkeypatch.setattr(decoder, "_bounds", lambda seqs: [None] * len(seqs))
            decoder.batch_policy = Goodput()
        calls.clear()
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=8)
        assert [o.ids for o in outs] == reference
        forwards[name] = len(calls)
    assert forwards["bounded"] < forwards["cut after"]


def test_a_sampled_batch_ignores_the_policy(case):
    """A sampled request's draws follow its draft: cutting it by its neighbours would change them."""
    from spec_zoo.batch_policy import Schedule

    model, _, _ = case
    sampling, seeds = SamplingParams(temperature=1.0), [11, 12]

    def decoder(policy):
        return SpeculativeDecoder(Target(model), NgramDrafter(), sampling=sampling, batch_policy=policy)

    alone = [decoder(None).generate(p, 16, eos_token_ids=[], seed=s).ids for p, s in zip(PROMPTS[3:5], seeds)]
    outs = decoder(Schedule({1: 0})).generate_batch(PROMPTS[3:5], 16, eos_token_ids=[], seeds=seeds, batch_size=2)
    assert [o.ids for o in outs] == alone


# -- the command line: spec-zoo prompts_file=... batch_size=... out=... ------------------------------
def _cli(*args: str):
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("spec-zoo"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def test_prompts_file_reads_jsonl_and_text_and_names_a_bad_line(tmp_path):
    from spec_zoo.batch_run import read_prompts

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('"Tell me about bees"\n\n[5, 6, 7]\n{"prompt": "Hi, there"}\n{"prompt": [8, 9]}\n')
    assert read_prompts(jsonl) == ["Tell me about bees", [5, 6, 7], "Hi, there", [8, 9]]
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\nsecond, with a comma\n")
    assert read_prompts(text) == ["first prompt", "second, with a comma"]
    for bad, message in [('{"prompt": "a"}\n{"prompt": \n', "line 2 is not JSON"),
                         ('{"text": "a"}\n', "line 1: .* holds no prompt"), ("[true, 2]\n", "holds no prompt"),
                         ('"  "\n', "holds no prompt"), ("\n\n", "holds no prompt; put one prompt per line")]:
        jsonl.write_text(bad)
        with pytest.raises(ConfigError, match=f"prompts_file: .*{message}"):
            read_prompts(jsonl)


def test_cli_decodes_a_file_of_prompts_in_batches_saves_each_and_resumes(tmp_path):
    """Each request's output is its output alone; `out` gets one line per request as it finishes,
    and a rerun after an interruption decodes only what is missing."""
    import json

    model_dir = tmp_path / "model"
    tiny_llama(0, sharpness=3.0).save_pretrained(model_dir)
    prompts = [PROMPTS[i] for i in (0, 3, 6, 9, 12)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / "results.jsonl"
    args = ["model=local", f"model.path={model_dir}", "drafter=ngram", "generation.max_new_tokens=6",
            f"prompts_file={tmp_path / 'p.jsonl'}", "batch_size=2", f"out={out}"]
    first = _cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("--- request ") == 5 and "5 requests, " in first.stdout
    assert "decoded 2 at a time, each drafting on its own" in first.stdout  # n-gram has no model to share
    assert "plain decoding (drafter=none) of the same 5 requests" in first.stdout and "same text: 5/5" in first.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    alone = [spec_zoo.generate(p, model=str(model_dir), drafter="ngram", max_new_tokens=6).ids for p in prompts]
    assert sorted((r["index"], r["ids"]) for r in rows) == list(enumerate(alone))

    kept = [line for line in out.read_text().splitlines() if json.loads(line)["index"] in (0, 1)]
    out.write_text("\n".join(kept) + '\n{"format": "spec-zoo-batch-res')  # the interrupted write of a third
    again = _cli(*args, "compare=false")
    assert again.returncode == 0, again.stderr
    assert "2 of 5 requests already in" in again.stdout and again.stdout.count("--- request ") == 3
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]
    assert sorted((r["index"], r["ids"]) for r in rows) == list(enumerate(alone))


def test_cli_refuses_an_out_file_it_did_not_write_before_loading_a_model(tmp_path):
    (tmp_path / "p.txt").write_text("one\ntwo\n")
    mine = tmp_path / "notes.jsonl"
    mine.write_text('{"my": "notes"}\n')
    common = [f"prompts_file={tmp_path / 'p.txt'}", "model=local", f"model.path={tmp_path / 'no-model'}"]
    result = _cli(*common, f"out={mine}")
    assert result.returncode == 2 and "out:" in result.stderr and "was not written by spec-zoo" in result.stderr
    assert mine.read_text() == '{"my": "notes"}\n'  # untouched
    other = tmp_path / "other.jsonl"
    other.write_text('{"format": "spec-zoo-batch-results", "index": 0, "prompt": "three"}\n')  # no settings needed
    result = _cli(*common, f"out={other}")
    assert result.returncode == 2 and "holds results of other prompts" in result.stderr
    both = _cli(*common, f"prompt_file={tmp_path / 'p.txt'}")
    assert both.returncode == 2 and "not both" in both.stderr


# -- the compiled runtime: every sequence's rows in one graph call --------------------------------------------
@pytest.fixture(scope="module", params=["float32", "bfloat16-amx"])
def compiled_case(request):
    """A compiled target (float32 on inductor's GEMM; bfloat16 on the AMX GEMM where the CPU has it)
    and each request's plain output decoded alone on it."""
    import torch

    from spec_zoo.runtime import CompiledTarget
    from tests.test_amx_gemm import has_amx

    if request.param == "bfloat16-amx" and not has_amx():
        pytest.skip("this CPU has no AMX-BF16: the bfloat16 runtime's batches are checked on AMX hosts")
    bf16 = request.param == "bfloat16-amx"
    model = tiny_llama(0, sharpness=3.0).to(torch.bfloat16 if bf16 else torch.float32)
    settings = {"gemm": "amx"} if bf16 else {}
    target = CompiledTarget(model, max_cache_len=64, buckets=(2, 4), key_block=16, **settings)
    target.warm_up()
    plain = SpeculativeDecoder(target)
    free = [plain.generate(p, MAX_NEW, eos_token_ids=[]).ids for p in PROMPTS]
    eos = [free[0][3]]
    return target, eos, [plain.generate(p, MAX_NEW, eos_token_ids=eos).ids for p in PROMPTS]


def _compiled_drafter(name: str, model):
    """A drafter of the compiled line-up: its draft model, head or exit compiled too where it has one."""
    from spec_zoo.drafters.cascade import CascadeDrafter
    from spec_zoo.drafters.eagle.drafter import EagleDrafter
    from spec_zoo.drafters.early_exit.drafter import EarlyExitDrafter
    from spec_zoo.drafters.hydra.drafter import HydraDrafter
    from spec_zoo.drafters.hydra.heads import HydraHeads
    from spec_zoo.drafters.medusa.drafter import MedusaDrafter
    from spec_zoo.drafters.none import NoDrafter
    from spec_zoo.drafters.parallel.drafter import ParallelDrafter
    from spec_zoo.drafters.quantized import QuantizedDrafter
    from spec_zoo.drafters.small_model import SmallModelDrafter
    from spec_zoo.drafters.suffix import SuffixDrafter
    from spec_zoo.trees import Static
    from tests.drafts import MEDUSA_TREE, eagle_head, medusa_heads, noisy_copy, parallel_draft, staged_heads

    dtype = str(model.dtype).removeprefix("torch.")

    def eagle(**options):
        return EagleDrafter(eagle_head(model).to(model.dtype), runtime="compiled", adaptive=False, **options)

    return {"none": NoDrafter, "ngram": NgramDrafter, "ngram_tree": lambda: NgramDrafter(branches=2),
            "suffix": SuffixDrafter,
            "medusa_tree": lambda: MedusaDrafter(medusa_heads(model), tree=Static(MEDUSA_TREE)),
            "hydra": lambda: HydraDrafter(staged_heads(HydraHeads, model), num_draft=3),
            "eagle": lambda: eagle(num_draft=3),
            "eagle_tree": lambda: eagle(tree={"policy": "topk", "width": 2, "depth": 2}),
            "early_exit": lambda: EarlyExitDrafter(1, num_draft=3, adaptive=False, reuse_kv=False,
                                                   runtime="compiled"),
            "small_model": lambda: SmallModelDrafter(noisy_copy(model, 1.0), num_draft=3, runtime="compiled",
                                                     dtype=dtype),
            "small_model_tree": lambda: SmallModelDrafter(noisy_copy(model, 1.0), runtime="compiled", dtype=dtype,
                                                          tree={"policy": "topk", "width": 2, "depth": 2}),
            "cascade": lambda: CascadeDrafter([NgramDrafter(num_draft=2, adaptive=False), eagle(num_draft=3)]),
            "parallel": lambda: ParallelDrafter(parallel_draft(model, k=3, dtype=dtype), num_draft=3,
                                                runtime="compiled", dtype=dtype),
            "parallel_tree": lambda: ParallelDrafter(parallel_draft(model, k=3, dtype=dtype), runtime="compiled",
                                                     dtype=dtype, tree={"policy": "topk", "width": 2, "depth": 3}),
            "quantized": lambda: QuantizedDrafter(num_draft=3, adaptive=False),
            }[name]()


# fixed lengths and trees (the others steer by the clock, or draft from a cache of every request's output)
COMPILED_STEADY = ("medusa_tree", "hydra", "eagle", "eagle_tree", "early_exit", "small_model", "small_model_tree",
                   "parallel", "parallel_tree", "quantized")


@pytest.mark.parametrize("drafter", ["none", "ngram", "ngram_tree", "suffix", "medusa_tree", "hydra", "eagle",
                                     "eagle_tree", "early_exit", "small_model", "small_model_tree", "cascade",
                                     "parallel", "parallel_tree", "quantized"])
def test_compiled_batches_score_every_sequence_in_one_forward(compiled_case, drafter, monkeypatch):
    """Each request equals its batch-1 output at every batch size, and a step of a batch of n runs
    one graph call for all n sequences (not n calls); the heads' drafters read each sequence's own
    hidden states out of the packed forward, and the compiled draft models, heads and exits hold
    each sequence's own cache: every request drafts what it drafts alone. A compiled EAGLE head
    drafts the batch together, alone or in a cascade: each level of every sequence's draft is one
    call of its graph; so does a compiled draft model, each next token of every chain (each level of
    every tree) one call, and a compiled parallel draft, every sequence's one forward one call."""
    from spec_zoo.runtime.compiled_head import CompiledHead
    from spec_zoo.runtime.target import Target

    target, eos, reference = compiled_case
    decoder = SpeculativeDecoder(target, _compiled_drafter(drafter, target.model))
    calls, head_calls, model_calls = [], [], []
    rows, together, fed_together = target._compiled_rows, CompiledHead.together, Target.together
    monkeypatch.setattr(target, "_compiled_rows",
                        lambda groups, *layers: calls.append(len(groups)) or rows(groups, *layers))
    monkeypatch.setattr(CompiledHead, "together",
                        lambda self, asks: head_calls.append(len(asks)) or together(self, asks))
    monkeypatch.setattr(Target, "together",
                        lambda self, asks: model_calls.append(len(asks)) or fed_together(self, asks))
    alone = None
    for size in SIZES:
        calls.clear()
        head_calls.clear()
        model_calls.clear()
        assert decoder.slots(size) == size
        outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=size)
        assert [o.ids for o in outs] == reference, f"batch_size={size}"
        assert max(calls) == min(size, len(PROMPTS))  # the sequences of a step share one forward
        if drafter in ("eagle", "eagle_tree"):  # the sequences of a draft level share one head call
            assert decoder.drafter.drafts_together
            assert (max(head_calls) > 1) == (size > 1) and max(head_calls) <= size
        if drafter in ("small_model", "small_model_tree", "parallel", "parallel_tree", "quantized"):
            # the sequences' next draft tokens (tree levels; a parallel draft's whole draft) share one draft-model
            # forward
            assert decoder.drafter.drafts_together
            assert (max(model_calls) > 1) == (size > 1) and max(model_calls) <= size
        if drafter == "cascade":  # its EAGLE member's calls go out of the cascade to be shared
            assert decoder.drafter.drafts_together and max(head_calls) <= size
        if drafter in COMPILED_STEADY:
            alone = alone or _drafts(outs)
            assert _drafts(outs) == alone, f"batch_size={size}"


def test_a_compiled_head_that_keeps_its_neighbours_kv_fails_the_draft_check(compiled_case, monkeypatch):
    """Planted fault: every sequence of a batch gets the compiled EAGLE head's first cache entry
    (each drafts on whatever its neighbours wrote there). Outputs stay right (verification is
    lossless); the per-request drafts of the check above must differ."""
    from spec_zoo.runtime.compiled_head import CompiledHead

    target, eos, reference = compiled_case
    decoder = SpeculativeDecoder(target, _compiled_drafter("eagle", target.model))
    alone = _drafts(decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=1))
    shared = CompiledHead.sequence
    monkeypatch.setattr(CompiledHead, "sequence", lambda self, slot=0: shared(self, 0))
    outs = decoder.generate_batch(PROMPTS, MAX_NEW, eos_token_ids=eos, batch_size=8)
    assert [o.ids for o in outs] == reference
    assert _drafts(outs) != alone


TREE = ([5, 2, 6, 3, 4, 7], [-1, -1, 0, 0, 2, 1])  # depth 3, two branches at the root: paths need a gather


def _two_steps(target, items, packed: bool) -> list:
    """The logits of two steps of each sequence: score its first draft, commit a path of it (a
    tree's inner path: its KV gathered into place), then score its second draft after that path
    and one more token; the sequences packed into one `score_batch` per step, or each alone."""
    import torch

    from spec_zoo.draft import Draft

    def steps(batch_items, states):
        first = target.score_batch([(st, prompt, draft) for st, (prompt, draft, _, _) in zip(states, batch_items)])
        seconds = []
        for st, (prompt, draft, path, second) in zip(states, batch_items):
            if st is not None:
                target.use(st)
            target.commit(path)
            if st is not None:
                st.update(target.sequence())
            seconds.append((st, prompt + [int(draft.tokens[i]) for i in path] + [7], second))
        return [s.logits for s in first + target.score_batch(seconds)]

    items = [(prompt, Draft(torch.tensor(tree[0]), tree[1]) if tree else Draft.chain(chain), path, Draft.chain(nxt))
             for prompt, tree, chain, path, nxt in items]
    if not packed:
        out = []
        for item in items:
            target.reset(0)
            first, second = steps([item], [None])
            out += [first, second]
        return out
    target.hold(len(items))
    states = []
    for slot in range(len(items)):
        target.reset(slot)
        states.append(target.sequence())
    logits = steps(items, states)
    return [x for pair in zip(logits[: len(items)], logits[len(items):]) for x in pair]


BATCH_STEPS = [  # prompt, tree (or None), chain, path committed, next draft
    (PROMPTS[3], TREE, None, [1, 5], [4, 4]),
    (PROMPTS[9], None, [3, 8, 2], [0, 1], []),
    (PROMPTS[14], TREE, None, [0, 3], [9]),
    (PROMPTS[5], None, [], [], [2, 2, 2]),
]


def test_packed_rows_are_bit_identical_to_each_sequence_scored_alone(compiled_case):
    """Mixed prompt lengths, trees and chains, a tree path gathered into place: every logit row of a
    packed batch equals the row of its sequence scored alone, bit for bit, over two steps."""
    import torch

    target = compiled_case[0]
    alone, packed = _two_steps(target, BATCH_STEPS, False), _two_steps(target, BATCH_STEPS, True)
    assert all(torch.equal(a, b) for a, b in zip(alone, packed, strict=True))


@pytest.mark.parametrize("fault", ["neighbours_rollback", "kv_to_neighbour"])
def test_a_planted_fault_between_neighbours_fails_the_batch_check(compiled_case, fault, monkeypatch):
    """Planted faults: one sequence's rollback (the gather that keeps a tree's accepted path) also
    applied to its neighbour's cache entry, or each row's KV written into its neighbour's entry.
    The check above must fail."""
    import torch
    import torch._dynamo

    from spec_zoo.runtime import CompiledTarget, PackedWrites, SlotCache

    target = compiled_case[0]
    alone = _two_steps(target, BATCH_STEPS, False)
    if fault == "neighbours_rollback":
        honest_commit = CompiledTarget.commit

        def commit(self, path):
            if path and path != list(range(len(path))):
                mine, pending, base = self.cache, self._pending, self._base
                self.cache = SlotCache(self.store, (mine.entry + 1) % self.entries)
                self.cache.set_length(mine.layers[0].length)
                honest_commit(self, path)
                self.cache, self._pending, self._base = mine, pending, base
            honest_commit(self, path)

        monkeypatch.setattr(CompiledTarget, "commit", commit)
    else:
        honest_update = PackedWrites.update

        def update(self, keys, values, layer_idx, *args, kwargs=None, **rest):
            moved = dict(kwargs, row_cache=kwargs["row_cache"].roll(1))
            return honest_update(self, keys, values, layer_idx, kwargs=moved)

        monkeypatch.setattr(PackedWrites, "update", update)
        torch._dynamo.reset()  # the fault must be traced into the graph
        target._graphs = {}
    try:
        packed = _two_steps(target, BATCH_STEPS, True)
    finally:
        if fault == "kv_to_neighbour":
            monkeypatch.undo()
            torch._dynamo.reset()
            target._graphs = {}
    assert not all(torch.equal(a, b) for a, b in zip(alone, packed, strict=True))
