"""Nothing the user had is lost: artefact directories are replaced only when they hold a
previous artefact (spec_zoo.artefacts.write_artefact), never the user's files or the current
directory; one spec-zoo-bench run writes into a results directory at a time, and a summary
counts a record key once. Tiny models; nothing outside tmp_path is read or written."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from spec_zoo.artefacts import write_artefact
from spec_zoo.bench.records import LOCK_FILE
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target
from tests.test_bad_input import result_record, results_dir, snapshot


def users_files(root):
    """A directory holding the user's files (as in the issue's probe)."""
    (root / "sub").mkdir(parents=True)
    (root / "precious.txt").write_text("mine")
    (root / "sub" / "notes.md").write_text("# notes")
    return root


def fail_if_loaded(monkeypatch):
    monkeypatch.setattr("spec_zoo.models.load_target", lambda *a, **k: pytest.fail("a model loaded before the refusal"))


def make_draft(*argv) -> int:
    from spec_zoo.cli import make_draft as main

    try:
        main(list(argv))
    except SystemExit as done:
        return done.code
    return 0


# -- spec-zoo-make-draft --------------------------------------------------------------------------


def test_make_draft_into_a_dir_of_the_users_files_is_refused_and_they_survive(tmp_path, monkeypatch, capsys):
    fail_if_loaded(monkeypatch)
    out = users_files(tmp_path / "mine")
    before = snapshot(out)
    for extra in ([], ["--overwrite"]):  # not even with --overwrite
        assert make_draft("--layers", "1", "--out", str(out), *extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --out: ") and "other files" in err and err.count("\n") == 1
        assert snapshot(out) == before


@pytest.mark.parametrize("files", [True, False])
def test_make_draft_into_the_current_folder_is_refused(tmp_path, monkeypatch, capsys, files):
    fail_if_loaded(monkeypatch)
    folder = tmp_path / "here"
    folder.mkdir()
    if files:
        (folder / "keep").mkdir()
        (folder / "a.txt").write_text("a")
        (folder / "keep" / "b.txt").write_text("b")
    monkeypatch.chdir(folder)
    before = snapshot(tmp_path)
    for out in (".", str(folder), str(tmp_path)):  # the current folder and its parents
        assert make_draft("--layers", "1", "--out", out, "--overwrite") == 2
        assert "current directory" in capsys.readouterr().err
    assert snapshot(tmp_path) == before and folder.is_dir()


def test_make_draft_replaces_only_its_own_previous_draft(tmp_path, monkeypatch, tiny_llama, capsys):
    target = Target(tiny_llama(num_hidden_layers=2))
    monkeypatch.setattr("spec_zoo.models.load_target", lambda *a, **k: target)
    out = tmp_path / "draft"
    assert make_draft("--layers", "1", "--out", str(out)) == 0  # new
    record = json.loads((out / "spec_zoo.json").read_text())
    assert record["format"] == "spec-zoo-truncated-draft" and (out / "config.json").is_file()
    (out / "model.safetensors").write_bytes(b"stale")
    assert make_draft("--layers", "1", "--out", str(out)) == 0  # a previous draft: replaced
    assert (out / "model.safetensors").read_bytes() != b"stale"
    (out / "todo.txt").write_text("mine")  # now it holds a file of the user's: refused
    before = snapshot(out)
    assert make_draft("--layers", "1", "--out", str(out), "--overwrite") == 2
    assert snapshot(out) == before
    capsys.readouterr()

    head = tmp_path / "head"  # another kind of artefact: only with --overwrite
    head.mkdir()
    (head / "eagle.json").write_text(json.dumps({"format": "spec-zoo-eagle-head"}))
    (head / "eagle.safetensors").write_bytes(b"x")
    assert make_draft("--layers", "1", "--out", str(head)) == 2
    assert "holds a spec-zoo-eagle-head artefact" in capsys.readouterr().err and (head / "eagle.json").is_file()
    assert make_draft("--layers", "1", "--out", str(head), "--overwrite") == 0
    assert not (head / "eagle.json").exists() and (head / "spec_zoo.json").is_file()


# -- spec-zoo-train ---------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["medusa", "distill", "eagle", "early_exit"])
def test_train_into_a_dir_of_the_users_files_is_refused_before_training(recipe, tmp_path, monkeypatch, capsys):
    from spec_zoo.train.cli import main

    fail_if_loaded(monkeypatch)
    out = users_files(tmp_path / "mine")
    before = snapshot(out)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["spec-zoo-train", recipe, f"output.dir={out}", "output.overwrite=true"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2
    assert "output.dir: " in capsys.readouterr().err
    assert snapshot(out) == before


# -- the one atomic writer ------------------------------------------------------------------------


def write(out, fmt="spec-zoo-eagle-head", record="eagle.json", overwrite=False, payload=b"new"):
    return write_artefact(out, record, {"format": fmt}, lambda tmp: (tmp / "w.safetensors").write_bytes(payload),
                          overwrite=overwrite)


def test_write_artefact_replaces_a_previous_artefact_of_its_kind_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "a"
    write(out, payload=b"old")
    write(out)  # same kind: replaced
    assert (out / "w.safetensors").read_bytes() == b"new" and sorted(p.name for p in out.iterdir()) == [
        "eagle.json", "w.safetensors"]
    with pytest.raises(ConfigError, match="output.dir: .* holds a spec-zoo-eagle-head artefact.*output.overwrite=true"):
        write(out, "spec-zoo-medusa-heads", "medusa.json")
    write(out, "spec-zoo-medusa-heads", "medusa.json", overwrite=True)  # asked for: replaced
    assert (out / "medusa.json").is_file() and not (out / "eagle.json").exists()
    (out / "sub").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="other files"):
            write(out, "spec-zoo-medusa-heads", "medusa.json", overwrite=overwrite)
    assert (out / "sub").is_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    write(empty)  # an empty directory is fine
    with pytest.raises(ConfigError, match="current directory"):
        write(tmp_path, overwrite=True)


def test_a_written_artefact_is_readable_under_the_users_umask(tmp_path):
    """Not the private modes of its temp dir (0700) and of safetensors' files (0600)."""
    import os
    import stat

    def private(tmp):
        (tmp / "w.safetensors").write_bytes(b"x")
        os.chmod(tmp / "w.safetensors", 0o600)

    old = os.umask(0o022)
    try:
        out = write_artefact(tmp_path / "a", "eagle.json", {"format": "spec-zoo-eagle-head"}, private)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {0o644}


def test_an_interrupted_write_keeps_the_previous_artefact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "a"
    write(out, payload=b"old")

    def broken(tmp):
        (tmp / "w.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_artefact(out, "eagle.json", {"format": "spec-zoo-eagle-head"}, broken)
    assert (out / "w.safetensors").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temp dir left behind


# -- spec-zoo-bench: one writer per results directory ------------------------------------------------

HOLD = """
import fcntl, sys
with open(sys.argv[1], "a") as lock:  # what a running spec-zoo-bench holds (spec_zoo.outputs.one_writer)
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_second_bench_into_a_busy_out_dir_is_refused(tmp_path, monkeypatch):
    """Another process is writing into out= (it holds the lock, as a running spec-zoo-bench
    does): this run is refused before loading a model, with a message naming the fix, and the
    results file is untouched; once the other has finished, a run gets past the lock."""
    from spec_zoo.bench.cli import bench
    from tests.test_bench import bench_config

    out = tmp_path / "run"
    results_dir(out, result_record())
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out / LOCK_FILE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        fail_if_loaded(monkeypatch)
        with pytest.raises(ConfigError, match=r"out: .* is being written by another spec-zoo-bench run.*another out="):
            bench(bench_config("methods=[ngram]", f"out={out}", "dataset.per_category=1"))
        assert snapshot(out) == before
    finally:
        holder.communicate("\n", timeout=60)

    class Loaded(Exception):
        pass

    monkeypatch.setattr("spec_zoo.models.load_target", lambda **_: (_ for _ in ()).throw(Loaded()))
    with pytest.raises(Loaded):  # the lock is free again: this run goes on to load the target
        bench(bench_config("methods=[ngram]", f"out={out}", "dataset.per_category=1"))


def test_duplicate_records_are_counted_once_and_said_so(tmp_path):
    """The race the lock prevents, as the issue found it: every key written twice."""
    from spec_zoo.bench.summary import OVERALL, summarize_file
    from spec_zoo.report.build import load_results

    records = [result_record(), result_record(method="ngram", config_hash="n", wall_s=0.25)]
    results_dir(tmp_path, *records, *records)
    summary = summarize_file(tmp_path / "results.jsonl")
    assert summary.cells["ngram", OVERALL].records == 1 and summary.get("ngram", OVERALL, "speedup") == 2.0
    assert "2 duplicate record(s)" in summary.warnings[0] and "2 duplicate record(s)" in summary.to_markdown()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(load_results([tmp_path])) == 2
    assert any("2 duplicate record(s)" in str(w.message) for w in caught)


# -- issue 42: every writer judges and writes the resolved path -------------------------------------------

PATH_FORMS = {  # name -> (how the path is written, given tmp_path); each one names the user's directory B
    "relative A/nosuch/../../B": lambda t: "A/nosuch/../../B",
    "absolute A/nosuch/../../B": lambda t: f"{t}/A/nosuch/../../B",
    "nested A/x/y/../../../B": lambda t: "A/x/y/../../../B",
    "symlink to B": lambda t: "LINK",
    "symlink then ..: L/../B": lambda t: "L/../B",
}


def escape_setup(tmp_path, monkeypatch):
    """A (an empty directory), B (the user's files), LINK -> B, and L -> A/inner (so L/../B is A/B,
    the user's files there too)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "A" / "inner").mkdir(parents=True)
    users_files(tmp_path / "B")
    users_files(tmp_path / "A" / "B")
    (tmp_path / "LINK").symlink_to(tmp_path / "B")
    (tmp_path / "L").symlink_to(tmp_path / "A" / "inner")
    return snapshot(tmp_path), sorted(str(p) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("form", PATH_FORMS)
def test_write_artefact_judges_the_path_it_writes(form, tmp_path, monkeypatch):
    """The bug: A/nosuch did not exist, so A/nosuch/../../B was judged "a new directory";
    the writer then made A/nosuch, and the same string named B, which it replaced."""
    files, paths = escape_setup(tmp_path, monkeypatch)
    for key, fmt in (("output.dir", None), ("export.out", "eagle3 layout")):
        with pytest.raises(ConfigError, match=f"{key}: .*other files"):
            write_artefact(PATH_FORMS[form](tmp_path), "config.json", {"format": "x"},
                           lambda tmp: (tmp / "w.safetensors").write_bytes(b"x"), key=key, fmt=fmt or "spec-zoo-x")
    assert snapshot(tmp_path) == files and sorted(str(p) for p in tmp_path.rglob("*")) == paths  # no A/nosuch either


def test_a_new_artefact_through_dotdot_is_written_where_the_path_resolves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "A").mkdir()
    out = write(tmp_path / "A" / "nosuch" / ".." / ".." / "new")
    assert out == tmp_path / "new" and (tmp_path / "new" / "eagle.json").is_file()
    assert not (tmp_path / "A" / "nosuch").exists()


@pytest.mark.parametrize("form", PATH_FORMS)
def test_make_draft_through_dotdot_or_a_symlink_is_refused_before_loading(form, tmp_path, monkeypatch, capsys):
    fail_if_loaded(monkeypatch)
    files, paths = escape_setup(tmp_path, monkeypatch)
    assert make_draft("--layers", "1", "--out", PATH_FORMS[form](tmp_path), "--overwrite") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out: ") and "other files" in err and err.count("\n") == 1
    assert snapshot(tmp_path) == files and sorted(str(p) for p in tmp_path.rglob("*")) == paths


@pytest.mark.parametrize("form", ["relative A/nosuch/../../B", "symlink to B"])
def test_train_output_dir_through_dotdot_is_refused_before_training(form, tmp_path, monkeypatch, capsys):
    from spec_zoo.train.cli import main

    fail_if_loaded(monkeypatch)
    files, paths = escape_setup(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", ["spec-zoo-train", "medusa", f"output.dir={PATH_FORMS[form](tmp_path)}"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2 and "output.dir: " in capsys.readouterr().err
    assert snapshot(tmp_path) == files and sorted(str(p) for p in tmp_path.rglob("*")) == paths


# -- issue 42: a file spec-zoo did not write is not replaced --------------------------------------------------


def report(*argv) -> int:
    from spec_zoo.report.cli import main

    return main(list(argv))


def test_report_never_replaces_the_users_markdown(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    results_dir(tmp_path / "RUN", result_record(), result_record(method="ngram", config_hash="n", wall_s=0.25))
    (tmp_path / "A").mkdir()
    (tmp_path / "notes.md").write_text("# my notes\n")
    (tmp_path / "mine.md").write_text("# mine\n")
    (tmp_path / "LINK.md").symlink_to(tmp_path / "mine.md")
    before = snapshot(tmp_path)
    for out in ("notes.md", str(tmp_path / "notes.md"), "A/nosuch/../../notes.md", "LINK.md"):
        assert report("RUN", "-o", out) == 2
        err = capsys.readouterr().err
        assert err.startswith("spec-zoo-report: error: -o: ") and "not written by spec-zoo" in err, err
        assert "--overwrite" in err and err.count("\n") == 1
        assert snapshot(tmp_path) == before and not (tmp_path / "A" / "nosuch").exists()
    assert report("RUN", "-o", "out.md") == 0  # a new file: written, and marked as spec-zoo's
    assert report("RUN", "-o", "out.md") == 0  # its own report: replaced
    assert (tmp_path / "out.md").read_text().startswith("<!-- written by spec-zoo")
    assert report("RUN", "-o", "notes.md", "--overwrite") == 0  # asked for
    assert (tmp_path / "notes.md").read_text() != "# my notes\n" and (tmp_path / "mine.md").read_text() == "# mine\n"


def test_report_never_replaces_a_figure_it_did_not_draw(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    results_dir(tmp_path / "RUN", result_record(), result_record(method="ngram", config_hash="n", wall_s=0.25))
    assert report("RUN", "-o", "rep") == 0
    drawn = sorted((tmp_path / "rep" / "figures").glob("*.png"))
    assert drawn and report("RUN", "-o", "rep") == 0  # its own figures: replaced
    drawn[0].write_bytes(b"my picture")
    (tmp_path / "rep" / "report.md").unlink()
    before = snapshot(tmp_path)
    assert report("RUN", "-o", "rep") == 2
    assert drawn[0].name in capsys.readouterr().err and snapshot(tmp_path) == before


def test_bench_summary_never_replaces_the_users_summary(tmp_path, monkeypatch):
    from spec_zoo.bench.cli import bench
    from tests.test_bench import bench_config

    run = tmp_path / "run"
    results_dir(run, result_record(), result_record(method="ngram", config_hash="n", wall_s=0.25))
    (run / "summary.md").write_text("my summary\n")
    (run / "todo.txt").write_text("mine")
    (tmp_path / "mine.md").write_text("mine\n")
    before = snapshot(tmp_path)
    fail_if_loaded(monkeypatch)
    with pytest.raises(ConfigError, match=r"summarize: .*summary.md exists and was not written by spec-zoo"):
        bench(bench_config(f"summarize={run / 'results.jsonl'}"))
    with pytest.raises(ConfigError, match=r"^out: .*summary.md exists and was not written by spec-zoo.*out="):
        bench(bench_config("methods=[ngram]", f"out={run}", "dataset.per_category=1"))
    assert snapshot(tmp_path) == before
    (run / "summary.md").unlink()
    (run / "summary.md").symlink_to(tmp_path / "mine.md")  # a link to the user's file: judged as that file
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="summarize: .*mine.md exists and was not written by spec-zoo"):
        bench(bench_config(f"summarize={run / 'results.jsonl'}"))
    assert snapshot(tmp_path) == before
    (run / "summary.md").unlink()
    bench(bench_config(f"summarize={run / 'results.jsonl'}"))  # new: written; then its own: replaced
    bench(bench_config(f"summarize={run / 'results.jsonl'}"))
    assert (run / "summary.md").read_text().startswith("<!-- written by spec-zoo")
    assert (run / "todo.txt").read_text() == "mine" and (tmp_path / "mine.md").read_text() == "mine\n"


# -- issue 42: one atomic writer ----------------------------------------------------------------------------


def test_an_interrupted_atomic_write_keeps_the_previous_file(tmp_path):
    import os
    import stat

    from spec_zoo.outputs import atomic_write

    path = tmp_path / "table.json"
    atomic_write(path, "old")

    def broken(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, broken)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]
    old = os.umask(0o022)
    try:
        atomic_write(path, b"new")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o644
    (tmp_path / "link.json").symlink_to(path)
    atomic_write(tmp_path / "link.json", "via link")  # written where the link points, the link kept
    assert (tmp_path / "link.json").is_symlink() and path.read_text() == "via link"


@pytest.mark.parametrize("command, key, name", [("train_report", "report.out", "report.md"),
                                                ("train_vocab", "vocab.out", "vocab.md")])
def test_train_report_and_vocab_refuse_the_users_files_before_any_work(command, key, name, tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from spec_zoo.registry import CONF_DIR
    from spec_zoo.train.report import run_report
    from spec_zoo.train.vocab import run_vocab

    fail_if_loaded(monkeypatch)
    monkeypatch.setattr("spec_zoo.train.loop.load_teacher_target", lambda cfg: pytest.fail("a target loaded"))
    out = users_files(tmp_path / "A" / "mine")
    (out / name).write_text("# my own notes")
    before = snapshot(tmp_path)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(command, overrides=[f"{key}={tmp_path}/A/nosuch/../mine", "vocab.bench_results=x"
                                          if command == "train_vocab" else "report.per_category=1"])
    with pytest.raises(ConfigError, match=f"^{key}: .*{name} exists and was not written by spec-zoo"):
        (run_report if command == "train_report" else run_vocab)(cfg)
    assert snapshot(tmp_path) == before and not (tmp_path / "A" / "nosuch").exists()
