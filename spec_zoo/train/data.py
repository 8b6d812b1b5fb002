"""Teacher data for distillation: the target's own continuations of training prompts,
with its next-token distributions (top-k log-probabilities) at every generated position.

On-policy data (DistillSpec): the draft is trained on the text the target itself writes,
which is what it will be asked to predict at decode time. `generate_batch` writes the
continuations of many prompts in one left-padded ``model.generate`` (each row stops at
its own EOS or at the length limit); the shared, resumable store of these batches is
`spec_zoo.train.store`.

Layout of a batch / shard (N sequences, T = max_new_tokens, k = top_k):
    ids        int32 [N, L]   prompt + continuation, right-padded with -1
    prompt_len int32 [N]
    gen_len    int32 [N]      generated tokens (EOS included when hit)
    topk_ids   int32 [N, T, k] token ids of the target's top-k at each generated position
    topk_logp  float16 [N, T, k] their log-probabilities under the full softmax
    category   int32 [N]      the prompt's mixture category (-1: outside the mixture)
Row t of ``topk_*`` is the target's distribution of token ``prompt_len + t`` given the
tokens before it (t < gen_len). The mass outside the top-k is 1 - sum(exp(topk_logp)).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from spec_zoo.errors import ConfigError
from spec_zoo.inputs import file_problem, read_utf8
from spec_zoo.outputs import atomic_write
from spec_zoo.runtime.layers import final_logits

PACKAGED_PROMPTS = Path(__file__).parent / "data" / "prompts.jsonl.gz"  # gzip, read as text (`read_utf8`)
#: text spec-zoo may not redistribute (data/SOURCE.md): in the repository's data/ folder, read
#: from a source checkout, never installed with the package
CHECKOUT_DATA = Path(__file__).resolve().parents[2] / "data"
CHECKOUT_ONLY = ("human_german.jsonl", "news_articles.jsonl")


def prompts_path(path, key: str = "data.prompts") -> Path:
    """``path``, or the file of that bare name shipped with spec-zoo (spec_zoo/train/data/, or
    data/ of a source checkout, e.g. ``human_german.jsonl``, stored gzipped as ``NAME.gz``; each
    folder's SOURCE.md says what each is) when there is no such file here."""
    given = Path(path).expanduser()
    if not given.is_file() and given.name == str(path):
        for shipped in (folder / name for folder in (PACKAGED_PROMPTS.parent, CHECKOUT_DATA)
                        for name in (given.name, given.name + ".gz")):
            if shipped.is_file():
                return shipped
        if given.name in CHECKOUT_ONLY:
            raise ConfigError(f"{key}={str(path)!r} is not installed with spec-zoo (no licence lets it redistribute "
                              "that text): it lies in data/ of the spec-zoo source repository, read when spec-zoo "
                              "runs from a checkout (`pip install -e .`); or give the file's path.")
    if problem := file_problem(given, "a JSONL file"):
        names = ", ".join(sorted({p.name.removesuffix(".gz") for p in PACKAGED_PROMPTS.parent.glob("*.jsonl*")}
                                 | set(CHECKOUT_ONLY)))
        raise ConfigError(f"{key}: {problem}; give a JSONL file with a `prompt` field per line "
                          f"(or a file shipped with spec-zoo: {names}).")
    return given


def read_records(path, key: str = "data.prompts") -> list[dict]:
    """The JSON records of a JSONL prompts file (`prompts_path`), each with a ``prompt``."""
    path = prompts_path(path, key)
    records = []
    # split on newlines only (not splitlines): a JSON string may hold U+2028 and other line breaks
    for i, line in enumerate(read_utf8(path, key).split("\n")):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"{key}: {str(path)!r} line {i + 1} is not a JSON object with a `prompt`; "
                              "fix or remove that line.") from None
        records.append(rec)
    return records


def load_prompts(path, num: int, sources=None, seed: int = 0) -> list[str]:
    """``num`` prompts (all when 0) from a JSONL file with a ``prompt`` field, in a
    seeded random order; ``sources``: keep records whose ``source`` starts with one of these."""
    records = [r["prompt"] for r in read_records(path)
               if not sources or any(str(r.get("source", "")).startswith(s) for s in sources)]
    if not records:
        raise ConfigError(f"data.prompts={str(path)!r} has no prompts (after data.sources={sources}).")
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = [records[i] for i in order]
    return chosen[:num] if num else chosen


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the chat template, ending with the assistant's turn to speak."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def second_turn_ids(tokenizer, first: str, answer: list[int], question: str) -> list[int]:
    """A conversation one turn on: ``first``, the target's own ``answer`` to it (special tokens
    dropped, as a chat front end passes it back) and ``question``, through the chat template."""
    reply = tokenizer.decode(answer, skip_special_tokens=True)
    return chat_ids(tokenizer, [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                                {"role": "user", "content": question}])


def encode_prompts(tokenizer, prompts: list[str], chat: bool, max_prompt_tokens: int) -> list[list[int]]:
    """Token ids per prompt (through the chat template when ``chat``); prompts longer than
    ``max_prompt_tokens`` are dropped rather than cut (a cut template is not a real prompt)."""
    out = []
    for text in prompts:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = chat_ids(tokenizer, [{"role": "user", "content": text}])
        else:
            ids = [int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"]]
        if 0 < len(ids) <= max_prompt_tokens:
            out.append(ids)
    return out


@dataclass
class TeacherData:
    """All sequences of the teacher data in memory (see the module docstring)."""

    ids: torch.Tensor
    prompt_len: torch.Tensor
    gen_len: torch.Tensor
    topk_ids: torch.Tensor
    topk_logp: torch.Tensor
    category: torch.Tensor

    def __len__(self) -> int:
        return self.ids.shape[0]

    def subset(self, index) -> TeacherData:
        index = torch.as_tensor(index, dtype=torch.long)
        return TeacherData(*(t[index] for t in (self.ids, self.prompt_len, self.gen_len, self.topk_ids, self.topk_logp,
                                                 self.category)))

    @property
    def positions(self) -> int:
        return int(self.gen_len.sum())

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs among the generated tokens."""
        counts = torch.zeros(vocab_size)
        for i in range(len(self)):
            p, g = int(self.prompt_len[i]), int(self.gen_len[i])
            counts += torch.bincount(self.ids[i, p : p + g].long(), minlength=vocab_size)[:vocab_size]
        return counts


def stop_and_pad_ids(target) -> tuple[list[int], int]:
    """(EOS ids that end a continuation, the padding id) of a `spec_zoo.runtime.target.Target`."""
    gen_cfg = getattr(target.model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        eos_ids.add(int(target.tokenizer.eos_token_id))
    pads = (getattr(target.tokenizer, "pad_token_id", None), getattr(gen_cfg, "pad_token_id", None))
    ordered = sorted(eos_ids)
    return ordered, int(next((x for x in pads if x is not None), ordered[0] if ordered else 0))


def data_key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _pad_batch(seqs: list[list[int]], pad_id: int):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding: generation continues from the right edge
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, top_k: int, temperature: float,
                   eos_ids: list[int], pad_id: int, seed: int) -> dict:
    """One batch of teacher sequences: continuations and top-k log-probs per position."""
    ids, mask = _pad_batch(prompts, pad_id)
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=ids.to(model.device), attention_mask=mask.to(model.device), max_new_tokens=max_new_tokens,
        do_sample=temperature > 0, temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
        eos_token_id=eos_ids or None, pad_token_id=pad_id, return_dict_in_generate=True, output_logits=True,
    )
    new = out.sequences[:, ids.shape[1] :].cpu()
    logits = torch.stack(out.logits, 1).float()  # [B, steps, V], raw (unprocessed) logits
    B, steps, V = logits.shape
    k = V if top_k <= 0 else min(top_k, V)
    logp = logits.log_softmax(-1)
    vals, idx = (t.cpu() for t in torch.topk(logp, k, dim=-1))
    del logits, logp, out
    gen_len = torch.full((B,), steps, dtype=torch.long)
    for i in range(B):
        hits = [t for t in range(steps) if int(new[i, t]) in eos_ids]
        if hits:
            gen_len[i] = hits[0] + 1
    rows = [p + new[i, : gen_len[i]].tolist() for i, p in enumerate(prompts)]
    width = max(len(r) for r in rows)
    seq = torch.full((B, width), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        seq[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    full_T = max_new_tokens
    topk_ids = torch.zeros((B, full_T, k), dtype=torch.int32)
    topk_logp = torch.full((B, full_T, k), float("-inf"), dtype=torch.float16)
    topk_ids[:, :steps] = idx.to(torch.int32)
    topk_logp[:, :steps] = vals.to(torch.float16)
    return {
        "ids": seq, "prompt_len": torch.tensor([len(p) for p in prompts], dtype=torch.int32),
        "gen_len": gen_len.to(torch.int32), "topk_ids": topk_ids, "topk_logp": topk_logp,
    }


def join_batches(parts: list[dict]) -> dict:
    """Batches (dicts in the layout above) as one, sequences padded to the widest."""
    width = max(p["ids"].shape[1] for p in parts)
    return {k: torch.cat([torch.nn.functional.pad(p[k], (0, width - p[k].shape[1]), value=-1) if k == "ids" else p[k]
                          for p in parts]) for k in parts[0]}


def from_parts(parts: list[dict]) -> TeacherData:
    """Batches or shards as one `TeacherData` (sequences without a category get -1)."""
    width = max(p["ids"].shape[1] for p in parts)
    ids = torch.cat([torch.nn.functional.pad(p["ids"], (0, width - p["ids"].shape[1]), value=-1) for p in parts])
    cat = {k: torch.cat([p[k] for p in parts]) for k in ("prompt_len", "gen_len", "topk_ids", "topk_logp")}
    category = torch.cat([p.get("category", torch.full((len(p["prompt_len"]),), -1)) for p in parts])
    return TeacherData(ids.long(), cat["prompt_len"].long(), cat["gen_len"].long(), cat["topk_ids"].long(),
                       cat["topk_logp"].float(), category.long())


# -- student-written continuations, scored by the target (DistillSpec's on-policy student data)


@torch.no_grad()
def student_continuations(student, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                          eos_ids: list[int], pad_id: int, seed: int) -> list[list[int]]:
    """Batched continuations written by ``student`` (a `spec_zoo.drafters.distilled.student.Student`),
    in the target's token ids (a reduced draft vocabulary is mapped back)."""
    from transformers import DynamicCache

    ids, mask = _pad_batch(prompts, pad_id)
    device = next(student.lm.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    body = student.base().model
    cache = DynamicCache(config=student.base().config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    embed = student.embed[0] if student.embed[0] is not None else body.embed_tokens
    gen = torch.Generator(device=device).manual_seed(seed)
    out: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    step_ids, attn = ids, mask
    for _ in range(max_new_tokens):
        hidden = body(inputs_embeds=embed(step_ids), attention_mask=attn, position_ids=positions,
                      cache=cache, use_cache=True).last_hidden_state[:, -1]
        logits = student.head(hidden).float()
        if temperature > 0:
            nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen)[:, 0]
        else:
            nxt = logits.argmax(-1)
        nxt = student.to_target_ids(nxt)
        for i, t in enumerate(nxt.cpu().tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t in eos_ids
        if bool(done.all()):
            break
        step_ids = nxt[:, None]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
        positions = positions[:, -1:] + 1
    return out


@torch.no_grad()
def score_continuations(model, prompts: list[list[int]], continuations: list[list[int]], top_k: int,
                        max_new_tokens: int) -> dict:
    """The target's top-k log-probs at every continuation position (one teacher-forced
    forward per batch), in the shard layout of the module docstring."""
    rows = [p + c for p, c in zip(prompts, continuations)]
    B, width = len(rows), max(len(r) for r in rows)
    ids = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    hidden = model.model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         use_cache=False).last_hidden_state
    V = model.get_output_embeddings().weight.shape[0]
    k = V if top_k <= 0 else min(top_k, V)
    topk_ids = torch.zeros((B, max_new_tokens, k), dtype=torch.int32)
    topk_logp = torch.full((B, max_new_tokens, k), float("-inf"), dtype=torch.float16)
    for i, (p, c) in enumerate(zip(prompts, continuations)):
        g = len(c)
        logp = final_logits(model, hidden[i, len(p) - 1 : len(p) - 1 + g]).float().log_softmax(-1)
        vals, idx = torch.topk(logp, k, dim=-1)
        topk_ids[i, :g], topk_logp[i, :g] = idx.to("cpu", torch.int32), vals.to("cpu", torch.float16)
    seq = torch.full((B, width), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        seq[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    return {"ids": seq, "prompt_len": torch.tensor([len(p) for p in prompts], dtype=torch.int32),
            "gen_len": torch.tensor([len(c) for c in continuations], dtype=torch.int32),
            "topk_ids": topk_ids, "topk_logp": topk_logp}


def _save_parts(parts: list[dict], path: Path) -> TeacherData:
    """Join batches into one shard, write it atomically to ``path`` and return it."""
    part = join_batches(parts)
    atomic_write(path, lambda tmp: save_file(part, str(tmp)))
    return from_parts([part])


def student_data(student, model, prompts: list[list[int]], *, cache_dir, key: str, max_new_tokens: int,
                 top_k: int, temperature: float, batch_size: int, eos_ids: list[int], pad_id: int, seed: int,
                 progress: bool = True) -> TeacherData:
    """Continuations written by the student, scored by the target; cached like `teacher_data`."""
    from tqdm import tqdm

    path = Path(cache_dir).expanduser() / key / "student.safetensors"
    if path.is_file():
        try:
            return from_parts([load_file(path)])
        except Exception:
            path.unlink()
    parts = []
    for b in tqdm(range(0, len(prompts), batch_size), desc="student data", disable=not progress, dynamic_ncols=True):
        batch = prompts[b : b + batch_size]
        cont = student_continuations(student, batch, max_new_tokens, temperature, eos_ids, pad_id, seed + b)
        keep = [i for i, c in enumerate(cont) if c]
        if keep:
            parts.append(score_continuations(model, [batch[i] for i in keep], [cont[i] for i in keep], top_k,
                                             max_new_tokens))
    return _save_parts(parts, path)


def _shared_prefix(sequences: list[list[int]]) -> int:
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != sequences[0][i] for s in sequences):
            return i
    return n


def forced_data(model, sequences: list[list[int]], *, cache_dir, key: str, top_k: int, batch_size: int,
                progress: bool = True) -> TeacherData:
    """Teacher-forced data: the target's distributions at every position of ``sequences``
    (prompts it reads rather than continuations it writes; one forward per batch instead
    of one per token, so many more positions for the same time). Cached like `teacher_data`."""
    from tqdm import tqdm

    path = Path(cache_dir).expanduser() / key / "forced.safetensors"
    if path.is_file():
        try:
            return from_parts([load_file(path)])
        except Exception:  # a torn write: redo it
            path.unlink()
    # the prefix all sequences share (a chat template's header and system prompt) is
    # trivially predictable: not scored, so it neither trains nor flatters the metrics
    shared = _shared_prefix(sequences)
    usable = [s for s in sequences if len(s) > max(shared, 1)]
    if not usable:
        raise ConfigError("data.forced_prompts: no prompt is longer than the prefix they all share.")
    start = max(shared, 1)
    width = max(len(s) for s in usable) - start  # positions scored per sequence
    parts = [score_continuations(model, [s[:start] for s in usable[b : b + batch_size]],
                                 [s[start:] for s in usable[b : b + batch_size]], top_k, width)
             for b in tqdm(range(0, len(usable), batch_size), desc="forced data", disable=not progress,
                           dynamic_ncols=True)]
    return _save_parts(parts, path)


def concat_data(a: TeacherData, b: TeacherData) -> TeacherData:
    """Both sets in one (sequences and teacher rows padded to the longer of the two)."""
    width, rows = max(a.ids.shape[1], b.ids.shape[1]), max(a.topk_ids.shape[1], b.topk_ids.shape[1])
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1)  # noqa: E731
    grow = lambda t, v: torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[1]), value=v)  # noqa: E731
    return TeacherData(torch.cat([pad(a.ids), pad(b.ids)]), torch.cat([a.prompt_len, b.prompt_len]),
                       torch.cat([a.gen_len, b.gen_len]), torch.cat([grow(a.topk_ids, 0), grow(b.topk_ids, 0)]),
                       torch.cat([grow(a.topk_logp, float("-inf")), grow(b.topk_logp, float("-inf"))]),
                       torch.cat([a.category, b.category]))
