"""Method A's pooled speed over method B's in one bench run, with a 95 % paired bootstrap CI over
prompts (question, turn; repeats pooled within a prompt), for ratios the report does not print
(e.g. `ngram_compiled` over `ar_compiled`), and one method pair's ratio over another's (``A/B:C/D``,
e.g. our speculation's speedup over our plain decoding against a peer engine's over its own).

    python docs/lineups/ratio_ci.py RESULTS.jsonl A/B [A/B ...] [A/B:C/D ...]

RESULTS may be gzipped (`.jsonl.gz`, as the line-ups kept in docs/ are).
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from collections import defaultdict

Prompt = tuple[object, int]


def totals(path: str) -> dict[str, dict[Prompt, list[float]]]:
    """Per method and prompt: [new tokens, seconds], summed over repeats."""
    by: dict[str, dict[Prompt, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            r = json.loads(line)
            cell = by[r["method"]][(r["question_id"], r["turn"])]
            cell[0] += r["new_tokens"]
            cell[1] += r["wall_s"]
    return by


def speed(cells: dict[Prompt, list[float]], prompts: list[Prompt]) -> float:
    return sum(cells[p][0] for p in prompts) / sum(cells[p][1] for p in prompts)


def main() -> None:
    by = totals(sys.argv[1])
    rng = random.Random(0)
    for spec in sys.argv[2:]:
        pairs = [tuple(pair.split("/")) for pair in spec.split(":")]
        names = [name for pair in pairs for name in pair]
        prompts = sorted(set.intersection(*(set(by[name]) for name in names)), key=str)

        def ratio(sample: list[Prompt], pairs: list = pairs) -> float:
            value = speed(by[pairs[0][0]], sample) / speed(by[pairs[0][1]], sample)
            for a, b in pairs[1:]:
                value /= speed(by[a], sample) / speed(by[b], sample)
            return value

        boots = sorted(ratio([rng.choice(prompts) for _ in prompts]) for _ in range(2000))
        label = " over ".join(f"({a} / {b})" if len(pairs) > 1 else f"{a} / {b}" for a, b in pairs)
        print(f"{label}: {ratio(prompts):.3f}x [{boots[50]:.3f}, {boots[1949]:.3f}] over {len(prompts)} prompts")


if __name__ == "__main__":
    main()
