"""Suffix decoding's speed over prompt lookup's against the requests its cache has seen, on the
repetitive track's compiled run (docs/suffix/repetitive_compiled/): writes gain_speed.png and
prints the table (extraction requests, in run order; a bucket's ratio pools its tokens and seconds).

    python docs/suffix/gain_speed.py
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
RUN = HERE / "repetitive_compiled" / "results.jsonl.gz"
BUCKETS = ((0, 0), (1, 4), (5, 9), (10, 15), (16, 23))


def main() -> None:
    records = [json.loads(line) for line in gzip.decompress(RUN.read_bytes()).decode().splitlines()]
    extraction = sorted({r["question_id"] for r in records if r["category"] == "extraction"})
    seen = {qid: n for n, qid in enumerate(extraction)}  # earlier extraction requests in the cache
    speed: dict[str, dict[int, tuple[int, float]]] = {}
    for r in records:
        if r["question_id"] in seen:
            tokens, seconds = speed.setdefault(r["method"], {}).get(r["question_id"], (0, 0.0))
            speed[r["method"]][r["question_id"]] = (tokens + r["new_tokens"], seconds + r["wall_s"])

    def pooled(method: str, qids) -> float:
        return sum(speed[method][q][0] for q in qids) / sum(speed[method][q][1] for q in qids)

    buckets = [[q for q in extraction if lo <= seen[q] <= hi] for lo, hi in BUCKETS]
    pooled_ratio = [pooled("suffix_compiled", qids) / pooled("ngram_compiled", qids) for qids in buckets]
    print("| earlier requests seen | requests | suffix tokens/s | ngram tokens/s | suffix / ngram |")
    print("|---|---|---|---|---|")
    for (lo, hi), qids, ratio in zip(BUCKETS, buckets, pooled_ratio, strict=True):
        s, n = pooled("suffix_compiled", qids), pooled("ngram_compiled", qids)
        print(f"| {lo}-{hi} | {len(qids)} | {s:.1f} | {n:.1f} | {ratio:.2f}x |")
    plt.figure(figsize=(6, 3.5))
    plt.plot([seen[q] for q in extraction],
             [pooled("suffix_compiled", [q]) / pooled("ngram_compiled", [q]) for q in extraction],
             "o", alpha=0.6, label="one request")
    plt.plot([(lo + hi) / 2 for lo, hi in BUCKETS], pooled_ratio, "-s", label="bucket, pooled")
    plt.axhline(1.0, color="grey", lw=0.8)
    plt.xlabel("earlier extraction requests in the suffix cache")
    plt.ylabel("suffix / ngram tokens/s")
    plt.title("Repetitive track (extraction), compiled runtime, 2 threads")
    plt.legend()
    plt.tight_layout()
    plt.savefig(HERE / "gain_speed.png", dpi=120)


if __name__ == "__main__":
    main()
