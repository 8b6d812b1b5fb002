"""``spec-zoo-train vocab``: what each draft-vocabulary size buys and costs, before training
at it (conf/train_vocab.yaml; the size is each recipe's ``<section>.vocab_size``).

A draft over K of the target's tokens can never draft the others (lossless: such a token
is simply not proposed), so its acceptance is capped by how much of the target's own text
those K tokens cover; a smaller K makes each drafted token cheaper (the head's last matrix
is K x H). For each size of ``vocab.sizes`` the tool picks the K most frequent tokens of a
teacher-data store's answers, FR-Spec style (`spec_zoo.train.batches.draft_vocab`, as the
recipes do), and measures

* **coverage**: the share of the target's tokens on a benchmark (its own greedy answers, a
  bench run's ``output_ids`` of ``vocab.bench_method``) inside the K tokens, per category,
  counted from the answers only and from answers and prompts (more text, same store);
* **cost**: an EAGLE head's eager draft of one token after ``vocab.context`` tokens (the
  drafter's own path in a decode: block, draft-vocabulary head, logits back to the target's vocabulary,
  argmax, the catching up on committed tokens included), timed interleaved with one eager
  target forward, as a ratio to it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

import torch
from safetensors.torch import load_file

from spec_zoo.bench.records import read_text
from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem
from spec_zoo.outputs import atomic_write, check_outputs, signed_markdown
from spec_zoo.runtime.target import Target
from spec_zoo.train.batches import select_vocab
from spec_zoo.train.data import from_parts
from spec_zoo.train.loop import load_teacher_target
from spec_zoo.train.store import shard_files


def store_counts(root, vocab_size: int) -> dict[str, torch.Tensor]:
    """Token counts of a teacher-data store: ``answers`` (the generated tokens, what the
    recipes choose from) and ``answers+prompts``."""
    root = Path(root).expanduser()
    shards = shard_files(root)
    if not shards:
        raise ConfigError(f"vocab.store={str(root)!r} holds no teacher-data shards; point it at a store a recipe "
                          "filled (data.store), or run a recipe with train.steps=0 first.")
    have = json.loads((root / "manifest.json").read_text()).get("target", {}).get("vocab_size")
    if have != vocab_size:
        raise ConfigError(f"vocab.store={str(root)!r} holds teacher data of a {have}-token vocabulary, not of this "
                          f"target's {vocab_size}; point it at this target's store.")
    data = from_parts([load_file(p) for p in shards])
    answers = data.token_counts(vocab_size)
    whole = torch.bincount(data.ids[data.ids >= 0].long(), minlength=vocab_size)[:vocab_size].float()
    return {"answers": answers, "answers+prompts": whole}


def bench_tokens(results, method: str) -> dict[str, torch.Tensor]:
    """The target's tokens on a benchmark: ``output_ids`` of ``method``'s first repeat per
    (question, turn) in a bench ``results.jsonl``, by category and ``all``."""
    path = Path(results).expanduser()
    if not path.is_file():
        raise ConfigError(f"vocab.bench_results: {file_problem(path, 'a results.jsonl')}; "
                          "give a bench run's results.jsonl.")
    seen: dict[tuple, tuple[str, list[int]]] = {}
    for line in read_text(path).splitlines():
        r = json.loads(line) if line.strip() else None
        if r and r["method"] == method:
            seen.setdefault((r["question_id"], r["turn"]), (r["category"], r["output_ids"]))
    if not seen:
        raise ConfigError(f"vocab.bench_method={method!r} has no records in {path}; name a method of that run.")
    out: dict[str, list[int]] = defaultdict(list)
    for category, ids in seen.values():
        out[category] += ids
        out["all"] += ids
    return {k: torch.tensor(out[k], dtype=torch.long) for k in sorted(out, key=lambda k: k == "all")}  # all last


def coverage(vocab_ids: torch.Tensor | None, tokens: torch.Tensor, vocab_size: int) -> float:
    """The share of ``tokens`` a draft over ``vocab_ids`` (None: all) can draft."""
    if vocab_ids is None:
        return 1.0
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[vocab_ids] = True
    return float(inside[tokens].double().mean())


@torch.no_grad()
def draft_costs(target: Target, vocabs: dict[str, torch.Tensor | None], context: int, repeats: int) -> dict:
    """Per vocabulary, seconds per drafted token of an eager EAGLE chain (one token a step, an
    untrained head of that size: the cost does not depend on the weights) in a greedy decode
    of a ``context``-token prompt (`spec_zoo.costs.measure_draft`, as ``spec-zoo costs``
    prices drafters); and ``target``: one eager target forward t(1) after ``context`` tokens.
    Each is the median of ``repeats`` rounds, every round measuring all of them in turn."""
    from spec_zoo.costs import draft_rounds
    from spec_zoo.decoder import SpeculativeDecoder
    from spec_zoo.drafters.eagle.drafter import EagleDrafter
    from spec_zoo.drafters.eagle.head import EagleHead

    prompt = [(7 * i) % target.vocab_size for i in range(context)]
    decoders = {name: SpeculativeDecoder(target, EagleDrafter(EagleHead(target.model, 0, vocab_ids=vocab).eval(),
                                                              num_draft=1, adaptive=False))
                for name, vocab in vocabs.items()}
    steps, times = draft_rounds(target, decoders, [prompt], repeats, max_new_tokens=16, step_repeats=3,
                                contexts=[context])
    return {**{k: median(v) for k, v in times.items()}, "target": median(steps)}


def run_vocab(cfg, target: Target | None = None) -> Path:
    """Run ``spec-zoo-train vocab``; return its markdown file."""
    v = cfg.vocab
    sizes = [int(s) for s in v.sizes]
    if not sizes or any(s < 0 for s in sizes):
        raise ConfigError(f"vocab.sizes={list(v.sizes)}; give draft-vocabulary sizes >= 0 (0 = the full vocabulary).")
    if not v.bench_results:
        raise ConfigError("vocab.bench_results is not set; give a bench run's results.jsonl (e.g. "
                          "docs/retrained/results.jsonl.gz): its answers are the tokens to cover.")
    out = check_outputs(v.out, ("vocab.json", "vocab.md"), "vocab.out",
                        "give vocab.out a new directory, or move that file away")  # before any work
    trim = Path(v.trim_head).expanduser() if v.get("trim_head") else None
    if trim is not None:
        from spec_zoo.train.trim import head_kind

        head_kind(trim)  # an EAGLE-3 or spec-zoo head, else refused before the target loads
        taken = [out / "trimmed" / _label(s) for s in sizes if (out / "trimmed" / _label(s)).exists()]
        if taken:
            raise ConfigError(f"vocab.out: {taken[0]} exists; give vocab.out a new directory, or move it away.")
    bench = bench_tokens(v.bench_results, str(v.bench_method))
    torch.set_num_threads(int(cfg.threads))
    target = target or load_teacher_target(cfg)
    V = target.vocab_size
    counts = store_counts(v.store or cfg.data.store, V)
    tok = target.tokenizer
    always = list(getattr(tok, "all_special_ids", []) or []) if tok is not None else []
    label = {s: "full" if not 0 < s < V else _label(s) for s in sizes}
    table: dict[str, dict] = {}
    vocabs: dict[str, torch.Tensor | None] = {}
    for source, c in counts.items():
        for s in sizes:
            vocab = select_vocab(c, s, always)
            if source == "answers":  # what the recipes choose from: the one the cost is measured for
                vocabs[label[s]] = vocab
            table[f"{label[s]} ({source})"] = {k: coverage(vocab, t, V) for k, t in bench.items()}
    trimmed = []
    if trim is not None:  # FR-Spec: the head's own rows of its most frequent tokens, no retraining
        from spec_zoo.train.trim import trim_head

        K = held.numel() if (held := artefact_vocab(trim)) is not None else V
        trimmed = [trim_head(trim, target.model, counts["answers"], s, out / "trimmed" / _label(s), always)
                   for s in sizes if 0 < s < K]
        for t in trimmed:
            print(f"spec-zoo-train vocab: wrote {t}, {trim.name} trimmed to its {t.name} most frequent tokens")
    for path in [*map(Path, v.artefacts or []), *trimmed]:
        ids = artefact_vocab(path.expanduser())
        name = f"{path.name} ({len(ids) if ids is not None else V})"
        table[name] = {k: coverage(ids, t, V) for k, t in bench.items()}
    costs = draft_costs(target, vocabs, int(v.context), int(v.repeats))
    meta: dict[str, Any] = {
            "store": str(v.store or cfg.data.store), "store_tokens": {k: int(c.sum()) for k, c in counts.items()},
            "bench_results": str(v.bench_results), "bench_tokens": {k: len(t) for k, t in bench.items()},
            "context": int(v.context), "repeats": int(v.repeats), "threads": int(cfg.threads),
            "load_average": list(os.getloadavg())}
    atomic_write(out / "vocab.json", json.dumps(
        {"format": "spec-zoo-vocab-report", "settings": meta, "coverage": table, "cost_s": costs}, indent=1))
    md = out / "vocab.md"
    cats = list(bench)
    lines = ["# Draft vocabulary: coverage and cost per size", "",
             f"Coverage: share of the target's tokens on the benchmark ({meta['bench_results']}, "
             f"{meta['bench_tokens']['all']} tokens) inside the K most frequent tokens of the teacher store "
             f"{meta['store']} ({meta['store_tokens']['answers']} answer tokens, "
             f"{meta['store_tokens']['answers+prompts']} with the prompts), `spec-zoo-train vocab`.", "",
             "| vocabulary | " + " | ".join(cats) + " |", "|" + "---|" * (1 + len(cats))]
    lines += [f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in cats) + " |" for name, row in table.items()]
    lines += ["", f"Eager cost of one drafted token (EAGLE head, {meta['context']} tokens of context, median of "
              f"{meta['repeats']} interleaved repeats, {meta['threads']} thread(s), load average "
              f"{meta['load_average'][0]:.2f}): seconds, and as a share of one eager target forward.", "",
              "| vocabulary | draft token (ms) | / target forward |", "|---|---|---|"]
    lines += [f"| {k} | {costs[k] * 1e3:.2f} | {costs[k] / costs['target']:.3f} |" for k in vocabs]
    lines += [f"| target forward | {costs['target'] * 1e3:.2f} | 1 |", ""]
    atomic_write(md, signed_markdown("\n".join(lines), "spec-zoo-train vocab"))
    return md


def _label(size: int) -> str:
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)


def artefact_vocab(path: Path) -> torch.Tensor | None:
    """The draft vocabulary an artefact stores: ``vocab_ids`` in a head's weights, an EAGLE-3
    head's ``t2d`` (the target ids its draft vocabulary holds; both published layouts), or
    ``draft_vocab`` in a distilled draft's record (None: the full vocabulary)."""
    for weights in sorted(path.glob("*.safetensors")):
        found = load_file(weights)
        if "vocab_ids" in found:
            return found["vocab_ids"].long()
        if "t2d" in found:
            held = found["t2d"].bool()
            return None if bool(held.all()) else held.nonzero().flatten()
    for record in path.glob("*.json"):
        ids = json.loads(record.read_text()).get("draft_vocab") if record.name != "config.json" else None
        if ids:
            return torch.tensor(ids, dtype=torch.long)
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"vocab.artefacts: {path} holds no spec-zoo artefact; give an artefact's directory.")
    return None
