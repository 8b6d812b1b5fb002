"""Drop every (question, turn, repeat) group of which a record was written while other work ran on
the machine (lines 211-295 of results.jsonl: repeats 1-2, measured in session 13 while tests and
replays shared the CPU), from results and traces, so that a resumed run measures them again.

    python docs/lineups/flat_cost/redo.py results/flat_cost   (then the bench command again)
"""

import json
import sys
from pathlib import Path


def group(line: str) -> tuple:
    r = json.loads(line)
    return r["question_id"], r["turn"], r["repeat"]


def main() -> None:
    run = Path(sys.argv[1])
    lines = (run / "results.jsonl").read_text().splitlines()
    disturbed = {g for g in map(group, lines[210:295]) if g[2] > 0}
    for name in ("results.jsonl", "traces.jsonl"):
        rows = (run / name).read_text().splitlines()
        keep = [row for row in rows if group(row) not in disturbed]
        (run / name).write_text("".join(row + "\n" for row in keep))
        print(name, len(rows), "->", len(keep))
    print(sorted(disturbed))


if __name__ == "__main__":
    main()
