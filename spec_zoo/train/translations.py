"""Translation prompts the training collection lacks, written by the target itself
(``spec-zoo-train translations``).

Every record of the training prompts is English, so a draft never sees the German text
that Spec-Bench's translation prompts ("Translate German to English: ...") make the
target copy and translate, and a draft vocabulary chosen from English data does not even
hold its sub-words (the shipped EAGLE head: alpha ~0.01 there). Round trip: English
sentences of the news articles in the prompts file are translated into German *by the
target* (greedy), and each German answer that looks German becomes the prompt
``Translate German to English: <German>``, with ``source`` ``synthetic-translation-de-en``.
The German is the target's, not a human's: what this buys is German tokens and the
task's form, never a benchmark question. The command writes every record of
``data.prompts`` followed by the new ones, so the mixture draws them as the category
``translation`` (``data.mixture.translation.share``, 0 by default; docs/training.md).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from spec_zoo.errors import ConfigError
from spec_zoo.outputs import atomic_write, resolved
from spec_zoo.train.data import PACKAGED_PROMPTS, encode_prompts, generate_batch, read_records, stop_and_pad_ids

SOURCE = "synthetic-translation-de-en"
ASK = "Translate English to German: {}"
PROMPT = "Translate German to English: {}"
# frequent German function words: two of them (and few English ones) mark an answer as German
GERMAN = frozenset("der die das und ist nicht mit für ein eine einen dem den des zu von auf im sich auch als "
                   "wie wird wurde sind hat haben werden bei nach aus über noch nur sie er es wir".split())
ENGLISH = frozenset("the and is are was were of to with for that this have has not be".split())


def english_sentences(records: list[dict], sources: list[str], seed: int, min_words: int = 6,
                      max_words: int = 25) -> list[str]:
    """Distinct sentences of ``min_words``..``max_words`` words from the inputs (after the
    first blank line: the article, not the instruction) of records whose ``source`` starts
    with one of ``sources``, in a seeded order."""
    seen, out = set(), []
    for r in records:
        if not any(str(r.get("source", "")).startswith(s) for s in sources):
            continue
        text = r["prompt"].split("\n\n", 1)[-1]
        text = re.sub(r"^\w+:\s*", "", text)  # "Article: ..."
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            sentence = " ".join(sentence.split())
            if min_words <= len(sentence.split()) <= max_words and sentence not in seen and '"' not in sentence:
                seen.add(sentence)
                out.append(sentence)
    order = torch.randperm(len(out), generator=torch.Generator().manual_seed(seed)).tolist()
    return [out[i] for i in order]


def looks_german(text: str) -> bool:
    """At least two German function words, more than twice the English ones, and no loop (a
    small model's failure mode: under 70 % distinct words is a repetition, not a sentence)."""
    words = re.findall(r"[a-zäöüß]+", text.lower())
    german, english = sum(w in GERMAN for w in words), sum(w in ENGLISH for w in words)
    return german >= 2 and german > 2 * english and len(set(words)) >= 0.7 * len(words)


@torch.no_grad()
def translate(target, sentences: list[str], batch_size: int, max_new_tokens: int,
              progress: bool = True) -> list[str | None]:
    """The target's greedy German for each sentence (its first line), or None where the answer
    does not look German."""
    from tqdm import tqdm

    tok = target.tokenizer
    eos_ids, pad_id = stop_and_pad_ids(target)
    prompts = [encode_prompts(tok, [ASK.format(s)], True, 10**6)[0] for s in sentences]
    out: list[str | None] = []
    for b in tqdm(range(0, len(prompts), batch_size), desc="german", disable=not progress, dynamic_ncols=True):
        batch = generate_batch(target.model, prompts[b : b + batch_size], max_new_tokens, 1, 0.0, eos_ids, pad_id, b)
        for i in range(len(batch["gen_len"])):
            p, g = int(batch["prompt_len"][i]), int(batch["gen_len"][i])
            text = tok.decode(batch["ids"][i, p : p + g].tolist(), skip_special_tokens=True).strip()
            line = text.split("\n")[0].strip().strip('"').strip()
            ended = g < max_new_tokens or "\n" in text  # an answer cut at the limit is usually a loop
            out.append(line if ended and looks_german(line) and len(line.split()) >= 4 else None)
    return out


def make_translations(cfg: DictConfig, target=None) -> Path:
    """Run ``spec-zoo-train translations`` (conf/train_translations.yaml); return the written file."""
    from spec_zoo.train.loop import load_teacher_target

    t = cfg.translations
    out = resolved(t.out)
    src = Path(cfg.data.prompts or PACKAGED_PROMPTS).expanduser()
    if out.resolve() == src.resolve():
        raise ConfigError(f"translations.out={str(out)!r} is data.prompts itself; write to another file.")
    if int(t.num) < 1:
        raise ConfigError(f"translations.num={t.num}; ask for at least one prompt.")
    records = read_records(src)
    sentences = english_sentences(records, list(t.sources), int(cfg.data.seed))
    if not sentences:
        raise ConfigError(f"translations.sources={list(t.sources)} match no record of {src.name} with sentences "
                          "to translate; name sources whose prompts hold English prose.")
    torch.set_num_threads(int(cfg.threads))
    if target is None:
        target = load_teacher_target(cfg)
    made: list[dict] = []
    pos, num = 0, int(t.num)
    while len(made) < num and pos < len(sentences):  # more sentences until enough answers look German
        rate = max(len(made) / pos, 0.05) if pos else 0.25  # the share of answers kept so far
        chunk = sentences[pos : pos + int((num - len(made)) / rate) + 1]
        german = translate(target, chunk, int(cfg.data.batch_size), int(t.max_new_tokens), bool(cfg.progress))
        made += [{"prompt": PROMPT.format(g), "source": SOURCE, "source_id": f"{SOURCE}:{pos + i}", "english": s}
                 for i, (s, g) in enumerate(zip(chunk, german)) if g is not None]
        pos += len(chunk)
    made = made[:num]
    atomic_write(out, src.read_text(encoding="utf-8").rstrip("\n") + "\n"
                 + "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in made))
    print(f"{len(made)} translation prompts (of {len(sentences)} sentences available) after the "
          f"{len(records)} records of {src.name}", file=sys.stderr)
    return out
