"""The what-if projection: per-step traces from spec-zoo-bench (written, resumable), their
replay under a cost table (hand-computed arithmetic; the run's own table reproduces the
measured speedup), the cost model's picks on flat and steep tables, and bad input (exit 2).
A tiny random Llama stands in for the target; nothing outside tmp_path is read or written."""

from __future__ import annotations

import json

import pytest

from spec_zoo.bench.records import TRACE_FILE, read_records, read_traces, record_key
from spec_zoo.bench.summary import summarize
from spec_zoo.costs import CostTable
from spec_zoo.report.cli import project as project_cli
from spec_zoo.report.projection import project, traced_records
from spec_zoo.runtime.target import Target
from spec_zoo.trees import RankAcceptance, path_shape
from tests.conftest import make_tiny_llama
from tests.test_bench import bench, build

METHODS = {"ar": None, "ngram": None, "small_auto": {"drafter": "small_model", "params": {"tree": "auto"}}}


@pytest.fixture(scope="module")
def target():
    return Target(make_tiny_llama())


@pytest.fixture
def draft_cache(tmp_path, monkeypatch):
    """A tiny draft model where drafter/small_model.yaml looks for the truncated draft."""
    monkeypatch.setenv("SPEC_ZOO_CACHE", str(tmp_path / "cache"))
    make_tiny_llama(seed=1, num_hidden_layers=1).save_pretrained(tmp_path / "cache" / "smollm2-135m-trunc4")


# -- traces from the bench -----------------------------------------------------------------------


def test_traces_are_written_per_record_and_resume(target, tmp_path, draft_cache):
    results, traces = tmp_path / "run" / "results.jsonl", tmp_path / "run" / TRACE_FILE
    methods = build(target, METHODS)
    records = bench(target, methods, results, traces_path=traces)
    steps = read_traces(traces)
    assert set(steps) == {record_key(r) for r in records}
    for r in records:
        s = steps[record_key(r)]
        assert len(s["drafted"]) == r["target_forwards"] and sum(s["committed"]) == r["new_tokens"]
        assert sum(s["drafted"]) == r["drafted"] and sum(map(len, s["ranks"])) == r["accepted"]
        assert all(len(w) == len(k) + 1 for w, k in zip(s["widths"], s["ranks"]))
        # tree=auto records what it predicted, per step and for the run; the others predict nothing
        auto = r["method"] == "small_auto"
        assert (r["predicted_speedup"] is not None) == auto == any(s["predicted"])
    assert any(w > 1 for r in records for ws in steps[record_key(r)]["widths"] for w in ws)  # auto drafted trees
    summary = summarize(records)
    assert summary.get("small_auto", "overall", "prediction_error") is not None

    # a rerun measures nothing; a record lost after its trace was written is measured again,
    # and its trace read once
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n")
    bench(target, methods, results, traces_path=traces)
    assert len(read_records(results)) == len(lines)
    assert len(read_records(traces)) == len(lines) + 1 and set(read_traces(traces)) == set(steps)


def test_path_shape_and_rank_acceptance():
    # root: children 0, 1; node 0: children 2, 3; the path takes 0 then its second child 3
    assert path_shape([-1, -1, 0, 0], [0, 3]) == ([2, 2, 0], [0, 1])
    assert path_shape([], []) == ([0], [])
    stats = RankAcceptance(3, decay=1.0)
    stats.observe([2, 2, 0], [0, 1])
    stats.observe([1, 1], [0])  # a chain says nothing about rank 1
    assert stats.tried == [4, 2, 0] and stats.seen == [2, 1, 0]
    assert stats.rates() == pytest.approx([(2 + 1) / (4 + 2), (1 + 0.5) / (2 + 2), 0.125])  # prior 0.5 / 2^r, weight 2


# -- replay arithmetic ------------------------------------------------------------------------------


def _steps(drafted, depth, committed, draft_s, verify_s, widths, ranks):
    return {"drafted": drafted, "depth": depth, "committed": committed, "draft_s": draft_s,
            "verify_s": verify_s, "widths": widths, "ranks": ranks, "predicted": [None] * len(drafted)}


AR = _steps([0, 0, 0], [0, 0, 0], [1, 1, 1], [0.01] * 3, [0.5, 0.1, 0.1], [[0]] * 3, [[]] * 3)
CHAIN = _steps([2, 3, 1], [2, 3, 1], [3, 2, 1], [0.02, 0.03, 0.01], [0.6, 0.25, 0.12],
               [[1, 1, 0], [1, 1], [1]], [[0, 0], [0], []])


def write_run(path, method_steps: dict[str, tuple[dict, float]]):
    """A results.jsonl and traces.jsonl holding one record per method: (steps, wall_s)."""
    path.mkdir(parents=True, exist_ok=True)
    with (path / "results.jsonl").open("w") as res, (path / TRACE_FILE).open("w") as tr:
        for method, (steps, wall) in method_steps.items():
            key = {"method": method, "question_id": 1, "turn": 1, "repeat": 0, "config_hash": method}
            res.write(json.dumps({**key, "schema_version": 1, "category": "qa", "new_tokens": sum(steps["committed"]),
                                  "wall_s": wall, "params": {}}) + "\n")
            tr.write(json.dumps({**key, "steps": steps}) + "\n")
    return path


def table(*seconds) -> CostTable:
    return CostTable(list(seconds), "tiny", "eager", "float32", 1, "test")


def test_replay_arithmetic_by_hand(tmp_path):
    # ar: 3 tokens in 0.75 s (steps 0.51 + 0.11 + 0.11, 0.02 s of loop); u = 0.1 s per plain step
    # chain: 6 tokens in 1.06 s (0.03 s of loop); steps 1 and 2 score 4 and 2 tokens
    run = write_run(tmp_path / "run", {"ar": (AR, 0.75), "chain": (CHAIN, 1.06)})
    [row] = project(traced_records([run]), table(0.1, 0.15, 0.2, 0.3))  # t(M)/t(1) = 1, 1.5, 2, 3
    assert row.measured == pytest.approx((6 / 1.06) / (3 / 0.75))
    # replay: ar 0.75 - 0.2 + 0.1 * (1 + 1) = 0.75; chain 1.06 - 0.37 + 0.1 * (3 + 1.5) = 1.14
    assert row.replay == pytest.approx((6 / 1.14) / (3 / 0.75))
    # acceptance: rank 0 accepted 3 times in 5 reached nodes with a child (prior 0.5, weight 2); rank 1 never drafted
    assert row.acceptance == pytest.approx([4 / 7, 0.25, 0.125, 0.0625]) and row.evidence[:2] == [5, 0]
    assert row.draft_cost == pytest.approx((0.03 + 0.01) / 0.1 / (3 + 1))  # 0.1 plain steps per level
    # a chain of 1 would give (1 + 4/7) / (0.1 + 1.5) < 1 token per plain step: no draft; time then
    # 1.06 - 0.37 - 0.04 kept + 0.1 * 3 tokens / 1 = 0.95
    assert row.chain.paths == [] and row.chain.speed == pytest.approx(1.0)
    assert row.chain.speedup == pytest.approx((6 / 0.95) / (3 / 0.75))


def test_replay_on_the_runs_own_table_gives_the_measured_speedup(tmp_path):
    exact = dict(CHAIN, verify_s=[0.6, 0.3, 0.15])  # steps 1, 2: 0.1 s x t(4) / t(1) = 3, x t(2) / t(1) = 1.5
    run = write_run(tmp_path / "run", {"ar": (AR, 0.75), "chain": (exact, 1.17)})
    [row] = project(traced_records([run]), table(0.1, 0.15, 0.2, 0.3))
    assert row.replay == pytest.approx(row.measured, rel=1e-12)


def test_a_flat_table_picks_a_bigger_tree_than_a_steep_one(tmp_path):
    tree = _steps([4] * 6, [2] * 6, [3, 2, 3, 1, 2, 3], [0.01] * 6, [0.5] + [0.2] * 5,
                  [[2, 1, 0], [2, 1], [2, 1, 0], [2], [2, 1], [2, 1, 0]], [[0, 0], [1], [0, 0], [], [0], [1, 0]])
    run = write_run(tmp_path / "run", {"ar": (AR, 0.75), "tree": (tree, 2.0)})
    records = traced_records([run])
    flat = project(records, table(*[0.1] * 64))[0]
    steep = project(records, table(*[0.1 * (1 + 0.6 * m) for m in range(64)]))[0]
    assert len(flat.tree.paths) > len(steep.tree.paths) and flat.tree.speedup > steep.tree.speedup
    assert len(flat.chain.paths) >= len(steep.chain.paths)
    assert max(p[-1] for p in flat.tree.paths) >= 1  # the flat table branches
    assert flat.evidence[1] > 0  # rank 1 was drafted and accepted: its rate is measured, not the prior


# -- bad input --------------------------------------------------------------------------------------


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    run = write_run(tmp_path / "run", {"ar": (AR, 0.75), "chain": (CHAIN, 1.06)})
    good = tmp_path / "table.json"
    table(0.1, 0.15).save(good)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"t": [1, 2]}))
    strings = tmp_path / "strings.json"
    strings.write_text(json.dumps({**json.loads(good.read_text()), "seconds": ["fast", "slow"]}))
    untraced = tmp_path / "untraced"
    untraced.mkdir()
    (untraced / "results.jsonl").write_text((run / "results.jsonl").read_text())
    cases = {
        "cannot be read": [str(run), "--costs", str(tmp_path / "missing.json")],
        "spec-zoo costs": [str(run), "--costs", str(wrong)],
        "seconds[0]='fast' is not a positive finite time": [str(run), "--costs", str(strings)],
        "traces=true": [str(untraced), "--costs", str(good)],
        "does not exist": [str(tmp_path / "nowhere"), "--costs", str(good)],
    }
    for fix, argv in cases.items():
        assert project_cli(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("spec-zoo-project: error:") and err.count("\n") == 1 and fix in err, err
    with pytest.raises(SystemExit) as exit_:
        project_cli([str(run)])  # no --costs
    assert exit_.value.code == 2
    assert project_cli([str(run), "--costs", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PROJECTION (cost model, not a measurement)") and "| chain | 1 |" in out
