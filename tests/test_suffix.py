"""drafter=suffix: lossless with every verifier, learns across requests, never lets a
benchmark repeat read its own earlier answer, and keeps its cache within its bounds."""

from __future__ import annotations

import json

import pytest
import torch

from spec_zoo.bench.dataset import Question
from spec_zoo.bench.methods import SpecZooMethod
from spec_zoo.bench.runner import run_benchmark, run_context
from spec_zoo.costs import CostTable
from spec_zoo.decoder import SpeculativeDecoder
from spec_zoo.drafters.none import NoDrafter
from spec_zoo.drafters.suffix import SuffixCache, SuffixDrafter, grow_tree, priced_size
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from spec_zoo.testing import CERTIFY_SETTINGS, assert_greedy_identity, assert_lossless, repetitive_prompt, tiny_llama


def test_greedy_identity_with_a_cache_shared_across_requests():
    shared = SuffixDrafter()  # one drafter for every seed and verifier: its cache is in use from the 2nd call
    assert_greedy_identity(lambda model: shared)
    assert len(shared.cache) >= 1
    assert_greedy_identity(lambda model: SuffixDrafter(tree=False, alpha=2.0, min_token_prob=0.0), seeds=(3,))


@pytest.mark.parametrize("setting", list(CERTIFY_SETTINGS))
def test_sampling_is_certified_exact_with_rejection(setting):
    """Exact, not sampled: the law of every generated sequence equals the target's (and the
    drafter did draft: tau above 1), for a chain and a frequency tree."""
    for drafter in (lambda: SuffixDrafter(), lambda: SuffixDrafter(tree=False, min_token_prob=0.0)):
        cert = assert_lossless(lambda model, make=drafter: make(), sampling=CERTIFY_SETTINGS[setting])
        assert cert.tau > 1.0


def test_a_suffix_chain_is_lossless_under_block_verification():
    """A chain (tree=false) is what the block rule verifies: greedy identity and exactness."""
    from spec_zoo.verifiers.block import BlockVerifier

    chain = dict(tree=False, min_token_prob=0.0)
    assert_greedy_identity(lambda model: SuffixDrafter(**chain), seeds=(0,), verifiers=[BlockVerifier()])
    cert = assert_lossless(lambda model: SuffixDrafter(**chain), BlockVerifier(), CERTIFY_SETTINGS["t1"])
    assert cert.tau > 1.0


def test_frequency_tree_is_best_first_within_budget_and_threshold():
    # after the match: 1 2 3 (x2), 1 2 4, 5 -> P(1)=3/4, P(1 2)=3/4, P(1 2 3)=1/2, P(1 2 4)=1/4, P(5)=1/4
    continuations = [[1, 2, 3], [1, 2, 3], [1, 2, 4], [5]]
    tokens, parents, probs = grow_tree(continuations, budget=10, min_prob=0.2, branching=True)
    assert tokens == [1, 2, 3, 4, 5] and parents == [-1, 0, 1, 1, -1]
    assert probs == pytest.approx([0.75, 0.75, 0.5, 0.25, 0.25])
    assert grow_tree(continuations, budget=3, min_prob=0.0, branching=True)[0] == [1, 2, 3]
    assert grow_tree(continuations, budget=10, min_prob=0.3, branching=True)[0] == [1, 2, 3]
    assert grow_tree(continuations, budget=10, min_prob=0.0, branching=False)[:2] == ([1, 2, 3], [-1, 0, 1])


def test_budget_grows_with_the_match_length():
    drafter = SuffixDrafter(alpha=1.0, max_spec=16, min_token_prob=0.0)
    seq = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    # the context ends in "8 9" (a 2-token match) or "7 8 9" (3): alpha * p nodes
    assert len(drafter._speculate([5, 8, 9], [(seq, 2)], limit=16)[0]) == 2
    assert len(drafter._speculate([7, 8, 9], [(seq, 2)], limit=16)[0]) == 3


STEEP = CostTable([1.0 + 0.6 * m for m in range(16)], "tiny", "eager", "float64", 1, "test")  # t(M) = 1 + 0.6 (M - 1)


def test_a_priced_tree_keeps_the_prefix_that_pays():
    probs = [1.0, 0.9, 0.2, 0.1]
    assert priced_size(probs, lambda m: 1.0, calibration=1.0) == 4  # free rows: draft everything
    # steep: 1 node 2.0/1.6, 2 nodes 2.9/2.2 (best), 3 nodes 3.1/2.8
    assert priced_size(probs, STEEP.relative, calibration=1.0) == 2
    assert priced_size(probs, STEEP.relative, calibration=0.5) == 0  # the counts are rarely right: no draft pays


class _Priced(SuffixDrafter):
    """A suffix drafter that sees the steep table, as in a run whose decoder carries one."""

    def propose(self, state):
        state.cost_table = STEEP
        return super().propose(state)


def test_priced_drafts_stay_lossless_and_are_cut_by_their_price():
    assert_greedy_identity(lambda model: _Priced(), seeds=(0,))
    model = tiny_llama(1, sharpness=1.0)  # a flatter target: the counts are often wrong, as on real text
    prompt = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    drafted = {}
    for name, drafter in (("priced", _Priced()), ("budget", _Priced(price=False))):
        out = _decoder(model, drafter).generate(prompt, max_new_tokens=60, eos_token_ids=[])
        drafted[name] = [s.drafted for s in out.stats.steps]
        assert drafter.calibration < 1.0 or name == "budget"  # it learned that the counts overstate
    assert sum(drafted["priced"]) < sum(drafted["budget"])
    assert max(drafted["priced"]) >= 2  # it still drafts where the counts pay
    cert = assert_lossless(lambda model: _Priced(), sampling=CERTIFY_SETTINGS["t1"])
    assert cert.tau > 1.0


def _decoder(model, drafter):
    return SpeculativeDecoder(Target(model), drafter)


def test_earlier_outputs_are_drafted_from_and_a_source_never_reads_its_own():
    model = tiny_llama(4, sharpness=3.0)
    prompt = repetitive_prompt(4)
    drafter = SuffixDrafter()
    decoder = _decoder(model, drafter)
    first = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[])
    second = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[])  # plain calls: the first is read
    assert second.ids == first.ids and second.stats.target_forwards < first.stats.target_forwards

    fresh = SuffixDrafter()
    decoder = _decoder(model, fresh)
    alone = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[], request_id="q1")
    # a repeat of q1 reads nothing q1 wrote: the same drafts again
    repeat = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[], request_id="q1")
    assert [s.drafted for s in repeat.stats.steps] == [s.drafted for s in alone.stats.steps]
    assert repeat.stats.target_forwards == alone.stats.target_forwards
    other = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[], request_id="q2")  # reads q1's output
    assert other.stats.target_forwards < alone.stats.target_forwards
    fresh.finish()
    assert len(fresh.cache) == 2  # q1's repeat replaced its first output


def test_bench_repeats_read_only_earlier_questions(tmp_path):
    model = tiny_llama(5, sharpness=3.0)
    target = Target(model)
    motif = repetitive_prompt(5)
    questions = [Question(1, "all", (tuple(motif),)), Question(2, "all", (tuple(motif),))]  # same text, two ids
    methods = [SpecZooMethod("ar", SpeculativeDecoder(target, NoDrafter()), {}, "h-ar"),
               SpecZooMethod("suffix", SpeculativeDecoder(target, SuffixDrafter()), {}, "h-suffix")]
    records = run_benchmark(methods, questions, lambda turns, answers: list(turns[0]), tmp_path / "r.jsonl",
                            target=target, context=run_context("tiny", "test", 0.0, target.device),
                            max_new_tokens=32, repeats=2, warmup_tokens=4, progress=False)
    suffix = {(r["question_id"], r["repeat"]): r for r in records if r["method"] == "suffix"}
    for qid in (1, 2):  # every repeat drafts exactly as the first: it never reads its own answer
        assert {suffix[(qid, r)]["target_forwards"] for r in range(2)} == {suffix[(qid, 0)]["target_forwards"]}
        assert all(suffix[(qid, r)]["matches_baseline"] for r in range(2))
    # question 2 (another id) reads question 1's output
    assert suffix[(2, 0)]["target_forwards"] < suffix[(1, 0)]["target_forwards"]


def test_cache_keeps_its_bounds_and_evicts_the_oldest():
    cache = SuffixCache(max_requests=3, max_tokens=25)
    for i in range(10):
        cache.add([i, 100, 101, 102, 103, i + 1], source=i, key=i)
        assert len(cache) <= 3 and cache.tokens <= 25
        memory = cache.memory()
        assert memory["index_entries"] == sum(len(t) - 1 for _, _, t in cache.outputs.values())
    assert [key for key, _, _ in cache.outputs.values()] == ["7", "8", "9"]  # kept as text
    assert set(cache.index) == {7, 8, 9, 100, 101, 102, 103}  # evicted outputs left no entries
    cache = SuffixCache(max_requests=10, max_tokens=12)
    for i in range(5):
        cache.add(list(range(i, i + 5)), source=i, key=i)
    assert cache.tokens == 10 and len(cache) == 2
    cache.add([50, 51, 52], source="s", key="k")
    cache.add([60, 61, 62], source="s", key="k")  # the same key replaces
    assert len(cache) == 2 and [t for k, _, t in cache.outputs.values() if k == "k"] == [[60, 61, 62]]
    assert cache.occurrences(50, hidden=None, limit=8) == []
    assert cache.occurrences(60, hidden="s", limit=8) == []
    assert cache.occurrences(60, hidden=None, limit=8) == [([60, 61, 62], 0)]


def test_cache_persists_as_json_and_refuses_other_files(tmp_path):
    path = tmp_path / "suffix.json"
    model = tiny_llama(6, sharpness=3.0)
    drafter = SuffixDrafter(cache_path=str(path))
    out = _decoder(model, drafter).generate(repetitive_prompt(6), max_new_tokens=12, eos_token_ids=[],
                                            request_id=7)  # a bench question id: saved as it ends
    saved = json.loads(path.read_text())
    assert saved["outputs"][0]["tokens"] == out.ids
    again = SuffixDrafter(cache_path=str(path))  # a resumed run: question 7 still cannot read its own output
    assert [t for _, _, t in again.cache.outputs.values()] == [out.ids]
    assert again.cache.occurrences(out.ids[0], hidden=7, limit=8) == []
    assert again.cache.occurrences(out.ids[0], hidden=8, limit=8)
    path.write_text(json.dumps({"format": "pickle"}))
    with pytest.raises(ConfigError, match="cache_path"):
        SuffixDrafter(cache_path=str(path))


def test_two_runs_sharing_a_cache_path_both_keep_their_outputs(tmp_path, monkeypatch):
    """Two processes with one drafter.cache_path (two drafters, each loaded before the other saved):
    each save merges what the other saved since, under the path's lock; none is lost."""
    import subprocess
    import sys

    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "suffix.json"
    first, second = SuffixDrafter(cache_path=str(path)), SuffixDrafter(cache_path=str(path))
    for k, drafter in enumerate([first, second, first, second]):
        drafter.cache.add([10 * k + 1, 10 * k + 2], source=f"s{k}", key=f"k{k}")
        drafter.cache.save(path)
    assert sorted(o["key"] for o in json.loads(path.read_text())["outputs"]) == ["k0", "k1", "k2", "k3"]
    assert not list(tmp_path.glob("*.lock")) and list((tmp_path / "cache" / "locks").glob("*.lock"))
    script = ("import sys; from spec_zoo.drafters.suffix import SuffixCache\n"
              "c = SuffixCache()\n"
              "for i in range(40):\n    c.add([i, i + 1], source=sys.argv[2], key=sys.argv[2] + str(i)); "
              "c.save(sys.argv[1])\n")
    runs = [subprocess.Popen([sys.executable, "-c", script, str(path), name]) for name in ("a", "b")]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    keys = {o["key"] for o in json.loads(path.read_text())["outputs"]}
    assert {f"{n}{i}" for n in "ab" for i in range(40)} <= keys


@pytest.mark.parametrize("kwargs", [{"max_match": 0}, {"alpha": 0}, {"min_token_prob": 2}, {"max_requests": -1}])
def test_bad_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError, match="drafter\\."):
        SuffixDrafter(**kwargs)


def test_the_replay_oracle_reproduces_a_recorded_greedy_answer():
    """docs/suffix/replay.py prices drafters on recorded answers: its stand-in target must
    make the decoder commit exactly the recorded tokens, drafts accepted where they match."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "suffix" / "replay.py"
    spec = importlib.util.spec_from_file_location("replay", path)
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)

    oracle = replay.Oracle(16)
    prompt, answer = [1, 2, 3, 4, 1, 2, 3], [4, 1, 2, 5, 6, 1, 2, 3, 4, 1]
    oracle.full = prompt + answer
    out = SpeculativeDecoder(oracle, SuffixDrafter()).generate(prompt, max_new_tokens=len(answer), eos_token_ids=[])
    assert out.ids == answer
    assert out.stats.target_forwards < len(answer)  # the repeats were drafted and accepted
    assert replay.drafter("suffix:price=false,alpha=2.0").alpha == 2.0
