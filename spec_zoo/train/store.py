"""The teacher-data store: one directory of target continuations every recipe reads
(distilled draft, exit adapter, EAGLE head, Medusa heads), generated once.

* ``manifest.json`` names what the data is of: the target (name, sizes, embedding
  fingerprint, as artefacts record it), the prompt mixture (prompts file digest,
  categories and shares, chat template, prompt-length limit, seed) and the generation
  settings. Opening a store for another target, mixture or settings fails with an
  ``error:`` naming the fix: mixing teacher data of two targets would train a draft on
  neither.
* ``shard-<start>-<end>.safetensors``: prompts start..end-1 of the mixture's
  prefix-stable order, in the layout of `spec_zoo.train.data` (tokens, top-k log-probs,
  categories). A shard is written atomically once complete, so an interrupted fill
  resumes after the last one written; a run asking for more prompts appends shards. A
  conversation's two turns share a shard: the second is asked after the target's answer to the first.
* ``shard-<start>-<end>.<name>.safetensors``: hidden states a recipe reads (``final``:
  the target's last-layer features; ``layer<E>``: the states entering layer E;
  ``layers<a>_<b>_..``: those entering layers a, b, .. side by side), one batched
  teacher-forced pass per shard, flat [positions, W] in sequence order. ``data.keep_states``
  names more of them to write in the same pass (`named_states`: one forward gives every
  layer's), so the recipes that read them later compute nothing.

``data.budget_s`` bounds a run's teacher-data work (both passes) in wall seconds: once spent,
the pass stops after the shard in progress and raises `BudgetSpent`; the same command, rerun,
reads what is on disk and goes on, so the store ends as an uninterrupted run leaves it.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.artefacts import describe_target, fingerprint_matches, read_record
from spec_zoo.errors import ConfigError
from spec_zoo.outputs import atomic_write, resolved
from spec_zoo.runtime.target import layer_states
from spec_zoo.train.data import TeacherData, from_parts, generate_batch, join_batches, second_turn_ids, stop_and_pad_ids
from spec_zoo.train.mixture import FollowUp, categories, describe, mixture_prompts, text_digest
from spec_zoo.train.workloads import Workloads, bench_ngrams, refuse_bench_overlap

FORMAT, VERSION = "spec-zoo-teacher-data", 1
_SHARD = re.compile(r"shard-(\d{7})-(\d{7})\.safetensors")


class BudgetSpent(Exception):
    """``data.budget_s`` ran out with the store part done: nothing is lost (every shard written
    is whole), and a command that needed all of it (training, the report) must stop rather than
    go on with part; the message says how far it got and that the same command continues."""


def data_budget(data) -> float:
    """``data.budget_s`` of a config's ``data`` section (0 = none), refused when negative."""
    seconds = float(data.get("budget_s", 0) or 0)
    if seconds < 0:
        raise ConfigError(f"data.budget_s={data.budget_s}; use 0 (no budget) or the wall seconds of teacher-data "
                          "work a run may spend before it stops, to be continued by the same command.")
    return seconds


class TeacherStore:
    """A store directory opened for one identity (target, prompts, generation); see the module docstring."""

    def __init__(self, root: Path, identity: dict, budget_s: float = 0.0):
        self.root, self.identity = root, identity
        self.used: list[tuple[Path, int]] = []  # (shard, rows taken) behind the last `fill`
        self.budget_s, self.opened = budget_s, time.time()  # data.budget_s, counted from the opening

    @classmethod
    def open(cls, root, identity: dict, budget_s: float = 0.0) -> TeacherStore:
        root = resolved(root)
        root.mkdir(parents=True, exist_ok=True)
        manifest = root / "manifest.json"
        fix = f"set data.store to another directory (or delete {root} to regenerate it)"
        if manifest.is_file():
            _check(read_record(manifest, FORMAT, VERSION, "teacher-data store", fix), identity, root, fix)
        else:
            _write_json(manifest, {"format": FORMAT, "format_version": VERSION, **identity, "sequences": 0})
        return cls(root, identity, budget_s)

    def _stop(self, what: str, done: int, total: int) -> None:
        """After a shard this run wrote: `BudgetSpent` once ``data.budget_s`` is spent, ``done`` of ``total`` ready."""
        if self.budget_s and done < total and time.time() - self.opened >= self.budget_s:
            raise BudgetSpent(f"data.budget_s={self.budget_s:g}: {what} of {done} of {total} prompts done in "
                              f"{self.root}; nothing is lost: rerun the same command to continue")

    def shards(self) -> dict[int, int]:
        """Complete shards on disk: start -> end (the longest one per start)."""
        found: dict[int, int] = {}
        for p in self.root.iterdir():
            if m := _SHARD.fullmatch(p.name):
                start, end = int(m[1]), int(m[2])
                found[start] = max(end, found.get(start, end))
        return found

    def fill(self, model, prompts: list[list[int] | FollowUp], categories: list[int], *, batch_size: int,
             eos_ids: list[int], pad_id: int, seed: int, shard_prompts: int = 128, progress: bool = True,
             tokenizer=None) -> TeacherData:
        """The teacher data of ``prompts`` (the first ones of the mixture's order), from the
        shards on disk and new ones generated for the rest. A `FollowUp` is generated after
        the row before it (in the same shard), whose answer ``tokenizer`` puts in its conversation."""
        from tqdm import tqdm

        g = self.identity["generation"]
        N, pos, parts, self.used = len(prompts), 0, [], []
        bar = tqdm(total=N, desc="teacher data", unit="prompt", disable=not progress, dynamic_ncols=True)
        try:
            while pos < N:
                existing = self.shards()
                wrote = pos not in existing  # the budget is checked after a shard written here: every run gets on
                if not wrote:
                    path = self.root / f"shard-{pos:07d}-{existing[pos]:07d}.safetensors"
                    part = self._load(path, prompts[pos : existing[pos]], pos)
                    if part is None:  # a torn file: regenerate it
                        continue
                else:
                    nxt = min([s for s in existing if s > pos], default=N)
                    end = min(pos + max(shard_prompts, batch_size), N, nxt)  # a shard holds at least one full batch
                    while end < min(N, nxt) and isinstance(prompts[end], FollowUp):  # never split a conversation
                        end += 1
                    path = self.root / f"shard-{pos:07d}-{end:07d}.safetensors"
                    part = _generate(model, prompts[pos:end], categories[pos:end], batch_size, g, eos_ids, pad_id,
                                     seed * 1_000_003 + pos, tokenizer)
                    _save(part, path)
                    manifest = {"format": FORMAT, "format_version": VERSION, **self.identity,
                                "sequences": max(self.shards().values())}
                    _write_json(self.root / "manifest.json", manifest)
                rows = min(len(part["gen_len"]), N - pos)
                parts.append({k: v[:rows] for k, v in part.items()})
                self.used.append((path, rows))
                pos += rows
                bar.update(rows)
                if wrote:
                    self._stop("teacher data", pos, N)
        finally:
            bar.close()
        return from_parts(parts)

    def _load(self, path: Path, expected: list[list[int] | FollowUp], start: int) -> dict | None:
        try:
            part = load_file(path)
        except Exception:
            path.unlink()
            return None
        for i, want in enumerate(expected):  # a second turn follows from the first, checked before it
            if not isinstance(want, FollowUp) and part["ids"][i, : int(part["prompt_len"][i])].tolist() != want:
                raise ConfigError(f"data.store={str(self.root)!r}: {path.name} holds another prompt at position "
                                  f"{start + i} than this config's mixture makes (the prompts file, tokenizer or chat "
                                  "template changed?); set data.store to another directory or delete that one.")
        return part

    def states(self, name: str, compute, batch_size: int, progress: bool = True,
               keep: tuple[str, ...] = ()) -> list[torch.Tensor]:
        """Hidden states ``name`` of every sequence of the last `fill` ([length, W] each, in its
        order), computed once per shard (batched, right-padded: causal attention keeps padding
        out of the real positions) and memory-mapped from disk (`mapped`): the states of a large
        store need not fit in memory. ``keep``: more states to write beside them from the same
        forward, where a shard lacks any. ``compute(ids [B, T]) -> {name: [B, T, W]}`` gives
        ``name`` and ``keep``'s (`named_states`)."""
        from tqdm import tqdm

        out: list[torch.Tensor] = []
        total = sum(rows for _, rows in self.used)
        for path, rows in tqdm(self.used, desc=f"target states ({name})", disable=not progress, dynamic_ncols=True):
            files = {n: path.with_name(f"{path.stem}.{n}.safetensors") for n in (name, *keep)}
            part = load_file(path)
            lengths = (part["prompt_len"] + part["gen_len"]).tolist()
            flat = None
            if files[name].is_file():
                try:
                    flat = mapped(files[name], "states")
                except Exception:
                    files[name].unlink()
            missing = [n for n, f in files.items() if not f.is_file()]  # a torn file of ``name`` is gone by now
            if missing:
                made = _states(compute, part["ids"], lengths, batch_size)
                for n in missing:
                    _save({"states": made[n]}, files[n])
                self._stop(f"target states ({', '.join(missing)})", len(out) + rows, total)
            if flat is None:
                flat = mapped(files[name], "states")
            out += list(torch.split(flat, lengths))[:rows]
        return out


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def mapped(file: Path, name: str) -> torch.Tensor:
    """Tensor ``name`` of a safetensors file memory-mapped, not read: pages come from disk as they
    are touched and the OS keeps what fits (a private mapping: the file is never written). A store's
    states outgrow memory (16k sequences of SmolLM2's three EAGLE-3 layers: ~20 GB), and reading
    them all in was what bounded a training run's data."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(size))[name]
    dtype = _DTYPES[info["dtype"]]
    item = torch.empty((), dtype=dtype).element_size()
    begin, end = (8 + size + offset for offset in info["data_offsets"])
    if end - begin != math.prod(info["shape"]) * item or begin % item:
        raise ValueError(f"{file}: {name}'s offsets do not match its shape and dtype")
    storage = cast(torch.UntypedStorage,
                   torch.UntypedStorage.from_file(str(file), shared=False, nbytes=file.stat().st_size))
    shape = info["shape"]
    return torch.empty(0, dtype=dtype).set_(storage, begin // item, shape,
                                            [math.prod(shape[i + 1:]) for i in range(len(shape))])


def shard_files(root) -> list[Path]:
    """The teacher-data shards of a store directory (none if it is not one), in order."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if _SHARD.fullmatch(p.name)) if root.is_dir() else []


class TeacherSet:
    """A config's teacher data (``cfg.data``, ``cfg.target``): the first ``wanted`` prompts
    of its mixture (all of ``data.token_ids`` when given; ``heldout``: evaluation prompts,
    see `mixture_prompts`; ``per_category``: only the first that many of each category;
    ``given``: these prompts instead, `spec_zoo.train.workloads`), the target's EOS and
    padding ids, and the store (``data.store``) opened for them, under ``data.budget_s``."""

    shard_prompts = 128  # prompts per new shard: what a budget's stop may cost, and what one shard's write keeps

    def __init__(self, cfg, target, wanted: int, heldout: frozenset | None = None, per_category: int = 0,
                 given: Workloads | None = None, heldout_ngram: int = 0):
        d, model = cfg.data, target.model
        budget_s = data_budget(d)  # refused before any work
        cats = categories(d)
        self.prompts: list[list[int] | FollowUp]
        if given is not None:
            self.prompts, self.categories, self.names = list(given.prompts), given.categories, given.names
            self.taken = {n: given.categories.count(c) for c, n in enumerate(given.names)}
        elif d.get("token_ids") is not None:  # tests / pre-tokenized prompts
            self.prompts = [list(map(int, p)) for p in d.token_ids]
            self.categories, self.names = [0] * len(self.prompts), ["token_ids"]
            self.taken = {"token_ids": len(self.prompts)}
        else:
            if target.tokenizer is None:
                raise ConfigError("the target has no tokenizer; give data.token_ids (pre-tokenized prompts).")
            if any(c["follow_up"] for c in cats.values()):
                refuse_bench_overlap([str(q) for q in d.follow_ups], bench_ngrams(None, 8), 8, "data.follow_ups",
                                     "Spec-Bench")
            self.prompts, self.categories, self.taken = mixture_prompts(target.tokenizer, d, cats, wanted, heldout,
                                                                        heldout_ngram)
            self.names = list(cats)
            short = [f"{k} {self.taken[k]} of {round(c['share'] * wanted)}" for k, c in cats.items()
                     if self.taken[k] < round(c["share"] * wanted) - 1]
            if short:  # the file has too few prompts of a category (under data.max_prompt_tokens): others fill in
                print(f"warning: data.mixture: too few prompts in {Path(d.prompts or 'the packaged file').name} for "
                      f"{', '.join(short)}; a larger file (data.prompts) keeps the shares", file=sys.stderr)
        if per_category:
            keep = [i for i, c in enumerate(self.categories) if self.categories[:i].count(c) < per_category]
            self.prompts, self.categories = [self.prompts[i] for i in keep], [self.categories[i] for i in keep]
        self.eos_ids, self.pad_id = stop_and_pad_ids(target)
        self.model, self.tokenizer, self.batch_size, self.seed = model, target.tokenizer, int(d.batch_size), int(d.seed)
        self.identity = {
            "target": describe_target(model, cfg.target.path or cfg.target.name),
            "prompts": given.identity() if given is not None else {
                **describe(d, cats), **({} if heldout is None else {"heldout": text_digest(heldout)}),
                **({"heldout_ngram": heldout_ngram} if heldout is not None and heldout_ngram else {}),
                **({"per_category": per_category} if per_category else {})},
            "generation": {"max_new_tokens": int(d.max_new_tokens), "top_k": int(d.top_k),
                           "temperature": float(d.temperature), "eos": self.eos_ids},
        }
        self.store = TeacherStore.open(d.store, self.identity, budget_s)

    def fill(self, n: int, progress: bool = True) -> TeacherData:
        """The teacher data of the first ``n`` prompts (generated where the store lacks them;
        a conversation is never cut between its turns: then one prompt fewer)."""
        if n < len(self.prompts) and isinstance(self.prompts[n], FollowUp):
            n -= 1
        return self.store.fill(self.model, self.prompts[:n], self.categories[:n], batch_size=self.batch_size,
                               eos_ids=self.eos_ids, pad_id=self.pad_id, seed=self.seed,
                               shard_prompts=self.shard_prompts, progress=progress, tokenizer=self.tokenizer)


@torch.no_grad()
def _states(compute, ids: torch.Tensor, lengths: list[int], batch_size: int) -> dict[str, torch.Tensor]:
    """{name: flat [positions, W]} of ``compute(ids [B, T]) -> {name: [B, T, W]}`` over every sequence, by length."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    per_seq: dict[str, list[torch.Tensor | None]] = {}
    for b in range(0, len(order), batch_size):
        rows = order[b : b + batch_size]
        T = max(lengths[i] for i in rows)
        for name, states in compute(ids[rows, :T].long().clamp(min=0)).items():
            kept = per_seq.setdefault(name, [None] * len(lengths))
            for j, i in enumerate(rows):
                kept[i] = states[j, : lengths[i]].cpu()
    return {name: torch.cat(cast(list[torch.Tensor], kept)).contiguous() for name, kept in per_seq.items()}


_STATE_NAME = re.compile(r"final|layer(\d+)|layers(\d+(?:_\d+)+)")


def state_layers(name: str, num_layers: int | None = None, key: str = "data.keep_states") -> tuple[int, ...] | None:
    """The hidden-states entries ``name`` reads (transformers' numbering: entry i enters layer i):
    None for ``final`` (the final norm's output). A name of no such form, or (given
    ``num_layers``) a layer the target lacks, is refused naming ``key``."""
    found = _STATE_NAME.fullmatch(name)
    if not found:
        raise ConfigError(f"{key}: {name!r} names no target states; use final, layer<E> (the states entering "
                          "layer E) or layers<a>_<b>_.. (those entering layers a, b, .. side by side).")
    layers = None if name == "final" else tuple(int(i) for i in (found[1] or found[2]).split("_"))
    if num_layers is not None and layers and not all(0 <= i < num_layers for i in layers):
        raise ConfigError(f"{key}: {name!r} names a layer the target lacks (layers 0..{num_layers - 1}).")
    return layers


def named_states(inner: torch.nn.Module, ids: torch.Tensor, names) -> dict[str, torch.Tensor]:
    """The states each of ``names`` names (`state_layers`), [B, T, W], from one forward of the
    target's decoder ``inner`` (a transformers base model) over the right-padded ``ids``."""
    out = inner(input_ids=ids, use_cache=False, output_hidden_states=True)
    return {name: layer_states(out.hidden_states, state_layers(name) or True) for name in names}


def _generate(model, prompts, categories, batch_size, g: dict, eos_ids, pad_id, seed, tokenizer=None) -> dict:
    """One shard: the first turns, then the second turns built from their answers; each in
    batches of similar-length prompts (less padding); back in prompt order."""
    first = [i for i, p in enumerate(prompts) if not isinstance(p, FollowUp)]
    part = _batched(model, [prompts[i] for i in first], batch_size, g, eos_ids, pad_id, seed)
    second = [i for i, p in enumerate(prompts) if isinstance(p, FollowUp)]
    if second:
        row = {i: j for j, i in enumerate(first)}
        if tokenizer is None or any(i - 1 not in row for i in second):
            raise ValueError("a FollowUp needs a tokenizer and its first turn in the row before it")
        ids = []
        for i in second:
            j, q = row[i - 1], prompts[i]
            p, n = int(part["prompt_len"][j]), int(part["gen_len"][j])
            ids.append(second_turn_ids(tokenizer, q.first, part["ids"][j, p : p + n].tolist(), q.question))
        part = join_batches([part, _batched(model, ids, batch_size, g, eos_ids, pad_id, seed + 500_009)])
    back = torch.empty(len(prompts), dtype=torch.long)
    back[torch.tensor(first + second)] = torch.arange(len(prompts))
    part = {k: v[back] for k, v in part.items()}
    part["category"] = torch.tensor(categories, dtype=torch.int32)
    return part


def _batched(model, prompts, batch_size, g: dict, eos_ids, pad_id, seed) -> dict:
    """Continuations of ``prompts`` in their order, generated in batches of similar length."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    pieces = [generate_batch(model, [prompts[i] for i in order[b : b + batch_size]], g["max_new_tokens"], g["top_k"],
                             g["temperature"], eos_ids, pad_id, seed + b)
              for b in range(0, len(order), batch_size)]
    part = join_batches(pieces)
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))
    return {k: v[back] for k, v in part.items()}


def _save(tensors: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp)))


def _write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=1))


def _check(manifest: dict, identity: dict, root: Path, fix: str) -> None:
    have, want = manifest.get("target") or {}, identity["target"]
    if (any(have.get(k) != want[k] for k in ("vocab_size", "hidden_size"))
            or not fingerprint_matches(have.get("fingerprint") or [], want["fingerprint"])):
        raise ConfigError(f"data.store={str(root)!r} holds teacher data of target {have.get('name')!r}, not of this "
                          f"target ({want['name']!r}); {fix}.")
    for key, what in (("prompts", "prompt mixture"), ("generation", "generation settings")):
        if manifest.get(key) != identity[key]:
            diff = sorted(k for k in set(identity[key]) | set(manifest.get(key) or {})
                          if (manifest.get(key) or {}).get(k) != identity[key].get(k))
            raise ConfigError(f"data.store={str(root)!r} holds teacher data of another {what} (differs in "
                              f"{', '.join(diff)}); {fix}, or restore the settings in its manifest.json.")
