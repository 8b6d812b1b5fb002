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
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing file at -o (report.md, a figure) that spec-zoo did not write; "
                             "other files there are never touched")
    parser.add_argument("--title", default="Benchmark report", help="title of the report")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    parser.add_argument("--note", default=None,
                        help="a paragraph put under the title (e.g. how the data was made); @FILE reads it from FILE")
    args = parser.parse_args(argv)
    from pathlib import Path

    from spec_zoo.inputs import read_utf8
    from spec_zoo.report.build import build_report

    note = args.note
    if note and note.startswith("@"):
        if not Path(note[1:]).is_file():
            print(f"spec-zoo-report: error: --note {note}: {note[1:]} is not a file.", file=sys.stderr)
            return 2
        try:
            note = read_utf8(note[1:], "--note").strip()
        except ConfigError as err:
            print(f"spec-zoo-report: error: {err}", file=sys.stderr)
            return 2
    first = Path(args.paths[0])
    out = Path(args.out or ((first if first.is_dir() else first.parent) / "report"))
    try:
        check_report_path(out, args.overwrite)
        path = build_report(args.paths, out, args.title, args.seed, note=note, overwrite=args.overwrite)
    except ConfigError as err:
        print(f"spec-zoo-report: error: {err}", file=sys.stderr)
        return 2
    print(f"report written to {path}")
    return 0


def check_report_path(out, overwrite: bool = False) -> None:
    """``-o``: a directory (made if new) or a .md file, where report.md and figures/ can be
    written without replacing a file spec-zoo did not write (`report_paths`), before the
    results are read."""
    from spec_zoo.report.build import report_paths

    report_paths(out, overwrite)


#: the projection's search bounds: a rank's prior acceptance halves per rank (2^-64 is nothing), and
#: a tree deeper than 64 levels is never predicted faster on any measured table
MAX_WIDTH = MAX_DEPTH = 64


def tree_bounds(max_nodes: int | None, max_depth: int, max_width: int, priced: int, costs: str) -> int:
    """``--max-nodes`` (default: 64, or what the table prices), refused with the estimate when
    the cost table cannot price such a tree or the search would not end in reasonable time."""
    if max_nodes is None:
        max_nodes = max(1, min(64, priced - 1))
    elif max_nodes > priced - 1:
        raise ConfigError(f"--max-nodes: {max_nodes} nodes make {max_nodes + 1} scored tokens, but {costs} prices "
                          f"t(M) only up to M={priced}; give --max-nodes {max(1, priced - 1)} or less (or a larger "
                          "table: spec-zoo costs).")
    for flag, value, most in (("--max-depth", max_depth, MAX_DEPTH), ("--max-width", max_width, MAX_WIDTH)):
        if value > most:
            raise ConfigError(f"{flag}: {value} is more than the projection searches (at most {most}: a tree of "
                              f"--max-nodes {max_nodes} has no use for more); give {flag} {most} or less.")
    return max_nodes


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
    parser.add_argument("--max-nodes", type=int, default=None,
                        help="largest tree considered (default 64, or fewer when the table prices fewer tokens; "
                             "at most the table's largest M - 1)")
    parser.add_argument("--max-depth", type=int, default=8,
                        help=f"deepest tree or longest chain considered (default 8, at most {MAX_DEPTH})")
    parser.add_argument("--max-width", type=int, default=4,
                        help=f"most children per node considered (default 4, at most {MAX_WIDTH})")
    args = parser.parse_args(argv)
    if min(args.max_nodes or 1, args.max_depth, args.max_width) < 1:
        parser.error("--max-nodes, --max-depth, --max-width: must be >= 1")
    from spec_zoo.report.projection import format_projection, load_table, project, traced_records

    try:
        table = load_table(args.costs)
        args.max_nodes = tree_bounds(args.max_nodes, args.max_depth, args.max_width, len(table.seconds), args.costs)
        records = traced_records(args.paths)
    except ConfigError as err:
        print(f"spec-zoo-project: error: {err}", file=sys.stderr)
        return 2
    rows = project(records, table, args.max_nodes, args.max_depth, args.max_width)
    print(format_projection(rows, table, args.costs, args.paths), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
