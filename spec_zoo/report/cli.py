"""``spec-zoo-report DIR_OR_FILE... [-o OUT] [--title T]``: merge benchmark results files
(every results.jsonl under the given directories) into one markdown report with PNG plots.
``spec-zoo-project DIR_OR_FILE... --costs TABLE``: replay their per-step traces under
another cost table (`spec_zoo.report.projection`)."""

from __future__ import annotations

import argparse
import sys

from spec_zoo.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (``error: <argument>: <problem>; <fix>``), exit 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    parser = _Parser(
        prog="spec-zoo-report",
        description="Turn spec-zoo-bench results (files, or directories searched for results.jsonl) into a "
                    "markdown report with tables and PNG figures. See docs/ablations.md.")
    parser.add_argument("paths", nargs="+", help="results.jsonl files or directories holding them (merged)")
    parser.add_argument("-o", "--out", default=None,
                        help="output directory (report.md + figures/) or a .md path; default: the first path's "
                             "directory + /report")
    parser.add_argument("--title", default="Benchmark report", help="title of the report")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    parser.add_argument("--note", default=None, help="a paragraph put under the title (e.g. how the data was made); @FILE reads it from FILE")
    args = parser.parse_args(argv)
    from pathlib import Path

    from spec_zoo.report.build import build_report

    note = args.note
    if note and note.startswith("@"):
        if not Path(note[1:]).is_file():
            print(f"spec-zoo-report: error: --note {note}: {note[1:]} is not a file.", file=sys.stderr)
            return 2
        note = Path(note[1:]).read_text(encoding="utf-8").strip()
    first = Path(args.paths[0])
    out = args.out or ((first if first.is_dir() else first.parent) / "report")
    try:
        path = build_report(args.paths, out, args.title, args.seed, note=note)
    except ConfigError as err:
        print(f"spec-zoo-report: error: {err}", file=sys.stderr)
        return 2
    print(f"report written to {path}")
    return 0


def project(argv=None) -> int:
    """``spec-zoo-project``: print the what-if projection of traced results under a cost table."""
    parser = _Parser(
        prog="spec-zoo-project",
        description="Replay the per-step traces of spec-zoo-bench results (run with traces=true) under another "
                    "scoring-cost table t(M) and print, per method, the tree and draft length the cost model would "
                    "pick there and the predicted speedups: a projection, not a measurement. See docs/trees.md.")
    parser.add_argument("paths", nargs="+", help="results.jsonl files or directories holding them (with traces.jsonl)")
    parser.add_argument("--costs", required=True,
                        help="a cost table JSON (spec-zoo costs writes one; docs/trees/roofline_gpu.json is a stated "
                             "GPU-like roofline)")
    parser.add_argument("--max-nodes", type=int, default=64, help="largest tree considered (default 64)")
    parser.add_argument("--max-depth", type=int, default=8, help="deepest tree or longest chain considered (default 8)")
    parser.add_argument("--max-width", type=int, default=4, help="most children per node considered (default 4)")
    args = parser.parse_args(argv)
    if min(args.max_nodes, args.max_depth, args.max_width) < 1:
        parser.error("--max-nodes, --max-depth, --max-width: must be >= 1")
    from spec_zoo.report.projection import format_projection, load_table, project, traced_records

    try:
        table = load_table(args.costs)
        records = traced_records(args.paths)
    except ConfigError as err:
        print(f"spec-zoo-project: error: {err}", file=sys.stderr)
        return 2
    rows = project(records, table, args.max_nodes, args.max_depth, args.max_width)
    print(format_projection(rows, table, args.costs, args.paths), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
