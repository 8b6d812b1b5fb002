"""spec-zoo-report on small synthetic results files: tables carry the known numbers,
figures are written, several files (a sweep) merge with per-file baselines, bad input
(another schema version, no results) is a clear error that leaves the files alone."""

from __future__ import annotations

import json

import pytest

from spec_zoo.bench.records import FIELDS, SCHEMA_VERSION
from spec_zoo.errors import ConfigError
from spec_zoo.report.build import build_report, load_results
from spec_zoo.report.cli import main as report_main


def record(method, qid, category, wall, forwards, *, drafter="none", params=None, repeat=0, temperature=0.0,
           match=None, margin=None, positions=None, draft_s=None, verify_s=None, config_hash=None):
    r = {f: None for f in FIELDS}
    r.update(schema_version=SCHEMA_VERSION, method=method, drafter=drafter, verifier="greedy", params=params or {},
             model="tiny", dataset="test", category=category, question_id=qid, turn=1, repeat=repeat,
             prompt_tokens=5, new_tokens=20, wall_s=wall, tokens_per_s=20 / wall, target_forwards=forwards,
             tau=20 / forwards, drafted=2 * forwards, accepted=20 - forwards, draft_s=draft_s, verify_s=verify_s,
             accept_per_position=positions, output_ids=[3] * 20, matches_baseline=match,
             top2_margin_at_mismatch=margin, temperature=temperature, seed=repeat, max_new_tokens=20,
             device="cpu", platform="test", machine="testbox", threads=1, torch_version="x",
             spec_zoo_version="0.1.0", config_hash=config_hash or f"h-{method}-{json.dumps(params)}-{temperature}")
    return r


def fixture_records(params=None, ngram_wall=0.5, temperature=0.0):
    """ar at 1 s per prompt; ngram (tau 2) at ``ngram_wall`` s -> speedup 1 / ngram_wall;
    hf_pld (no tau) at 0.8 s; one ngram near-tie mismatch."""
    rs = []
    for qid, cat in [(1, "qa"), (2, "qa"), (3, "rag"), (4, "rag")]:
        for rep in range(2):
            rs.append(record("ar", qid, cat, 1.0, 20, repeat=rep, temperature=temperature, draft_s=0.0, verify_s=1.0))
            rs.append(record("ngram", qid, cat, ngram_wall, 10, drafter="ngram", params=params, repeat=rep,
                             temperature=temperature, match=qid != 4, margin=0.05 if qid == 4 else None,
                             positions=[0.8, 0.5], draft_s=0.05, verify_s=0.4))
            r = record("hf_pld", qid, cat, 0.8, 20, drafter="prompt_lookup", repeat=rep, temperature=temperature,
                       match=True)
            r.update(target_forwards=None, tau=None, drafted=None, accepted=None)
            rs.append(r)
    return rs


def write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_report_tables_and_figures(tmp_path):
    results = write(tmp_path / "run" / "results.jsonl", fixture_records())
    md = build_report([tmp_path / "run"], tmp_path / "out")
    text = md.read_text()
    # overall: ngram 2x with a zero-width CI (every prompt has the same speedup), tau 2
    assert "| ngram | 2.00x | [2.00, 2.00] | 2.00x | 2.00x | 2.00 | 0.500 | 40.0 | 6/8 (2 of 2 near-ties" in text
    assert "| hf_pld | 1.25x | [1.25, 1.25] | 1.25x | 1.25x | - | - | 25.0 | 8/8 | - |" in text
    # cost model: tau 2 x 0.05 s/token / (0.005 s drafting per forward + 0.05)
    assert "| 1.82x |" in text
    assert "| ngram | 2.00x | 2.00x | 2.00x |" in text  # speedup by category: qa, rag, overall
    for name in ("speedup_by_category", "tau_vs_speedup", "acceptance_by_position", "predicted_vs_measured"):
        png = tmp_path / "out" / "figures" / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG", name
        assert f"figures/{name}.png" in text
    assert "| ngram | 0.80 | 0.50 |" in text  # acceptance by position
    assert "| ngram | 4 | 1 | 1 | 0.05 | near-tie (margin < 0.5)" in text  # each mismatch, explained
    assert "testbox" in text and "threads 1" in text
    assert results.read_text().count("\n") == 24  # the results file is untouched


def test_sweep_files_merge_with_their_own_baselines_and_labels(tmp_path):
    for k, wall in [(2, 0.8), (4, 0.5), (8, 0.4)]:
        # each job has its own ar; job k's ar is slower, so pairing across files would be wrong
        rs = fixture_records(params={"num_draft": k}, ngram_wall=wall * k / 4)
        for r in rs:
            if r["method"] == "ar":
                r["wall_s"] *= k / 4
        write(tmp_path / f"num_draft={k}" / "results.jsonl", rs)
    md = build_report([tmp_path], tmp_path / "report.md")
    text = md.read_text()
    assert "| ngram [num_draft=2] | 1.25x |" in text and "| ngram [num_draft=4] | 2.00x |" in text
    assert "| ngram [num_draft=8] | 2.50x |" in text
    assert (tmp_path / "figures" / "speedup_vs_draft_length.png").is_file()
    assert "3 results file(s)" in text


def test_temperature_sweep_labels(tmp_path):
    write(tmp_path / "t0" / "results.jsonl", fixture_records())
    write(tmp_path / "t1" / "results.jsonl", fixture_records(temperature=1.0, ngram_wall=0.8))
    text = build_report([tmp_path / "t0", tmp_path / "t1"], tmp_path / "out", figures=False).read_text()
    assert "| ngram [T=0.0] | 2.00x |" in text and "| ngram [T=1.0] | 1.25x |" in text


def test_bad_inputs_are_clear_errors_and_keep_files(tmp_path, capsys):
    old = fixture_records()
    for r in old:
        r["schema_version"] = 99
    path = write(tmp_path / "old" / "results.jsonl", old)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="schema_version=99.*reads schema_version=1"):
        load_results([path])
    assert report_main([str(path)]) == 2
    assert "spec-zoo-report: error:" in capsys.readouterr().err
    assert path.read_bytes() == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no results.jsonl"):
        load_results([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_results([tmp_path / "nope"])


def test_report_leads_with_sorted_speedups_and_marks_lossy_methods(tmp_path, monkeypatch):
    import spec_zoo.report.build as build

    rs = fixture_records()  # ngram 2.00x (lossless), hf_pld 1.25x (a transformers reference)
    for r in rs:
        r["lossless"] = {"ar": True, "ngram": True, "hf_pld": None}[r["method"]]
    # a lossy copy of ngram, faster still: 2.50x
    rs += [{**r, "method": "typical", "verifier": "typical", "lossless": False, "wall_s": 0.4,
            "config_hash": "h-typical"} for r in rs if r["method"] == "ngram"]
    write(tmp_path / "run" / "results.jsonl", rs)
    saved = {}
    save = build._save
    monkeypatch.setattr(build, "_save", lambda fig, path: saved.setdefault(path.stem, fig.axes[0]) and save(fig, path))
    text = build_report([tmp_path / "run"], tmp_path / "out").read_text()
    for name in ("speedup_overall", "speedup_by_category"):
        assert (tmp_path / "out" / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    # the answer comes first: the sentence and both figures before the protocol and the tables
    assert text.index("**Fastest: `typical (LOSSY)` at 2.50x") < text.index("figures/speedup_overall.png") \
        < text.index("figures/speedup_by_category.png") < text.index("## Protocol") < text.index("## Overall")
    assert "Fastest lossless: `ngram`, 2.00x" in text and "Lossy (hatched): `typical (LOSSY)`" in text

    bars = saved["speedup_overall"]
    order = [t.get_text() for t in bars.get_yticklabels()][::-1]  # barh draws bottom-up
    summary = build.summarize(load_results([tmp_path / "run"]), label=build.labeller(rs))
    assert order == [m for m, _ in sorted(((m, summary.get(m, "overall", "speedup")) for m in summary.methods
                                           if m != "ar"), key=lambda row: -row[1])]
    assert order == ["typical (LOSSY)", "ngram", "hf_pld"]
    by_row = {round(p.get_y() + p.get_height() / 2): p for p in bars.patches}
    widths = [by_row[y].get_width() for y in range(len(order))][::-1]
    assert widths == pytest.approx([1.5, 1.0, 0.25])  # bars grow from the baseline's 1.0
    hatches = {m: by_row[len(order) - 1 - i].get_hatch() for i, m in enumerate(order)}
    assert hatches["typical (LOSSY)"] == "//" and not hatches["ngram"] and hatches["hf_pld"] != "//"
    legend = {t.get_text() for t in bars.get_legend().get_texts()}
    assert {style[0] for style in build.VERIFIER_STYLE.values()} <= legend

    heat = saved["speedup_by_category"]
    assert [t.get_text() for t in heat.get_yticklabels()] == order  # rows in the bars' order
    assert [t.get_text() for t in heat.get_xticklabels()] == ["qa", "rag", "overall"]
    cells = [t.get_text() for t in heat.texts if t.get_text() != "small sample: CIs are wide"]
    assert cells == ["2.50"] * 3 + ["2.00"] * 3 + ["1.25"] * 3  # each cell's speedup printed in it
    width, _ = saved["speedup_by_category"].figure.get_size_inches() * build.DPI
    assert width <= 1400 and saved["speedup_overall"].figure.get_size_inches()[0] * build.DPI <= 1400
