"""How often the quantized copy's top token is the target's, teacher-forced, by weight and activation width.

``python -m spec_zoo.report.agreement [model=gemma3_270m] [per_category=5] [tokens=64]``

Each Spec-Bench prompt (the first turn, through the chat template where the target has one;
``per_category`` of each category) is continued greedily by the target for ``tokens`` tokens; the
target and each copy then read the whole text in one forward, and a position agrees where both put
the same token on top. This is the first-token acceptance a greedy chain would see if every draft
started from the target's own text: what the copy can give, before the cost of drafting. Prints one
Markdown table (every variant by category); writes nothing.
"""

from __future__ import annotations

import sys
import time

import torch

from spec_zoo.api import compose_config, load_checked_target, quiet_loading
from spec_zoo.bench.dataset import load_questions
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.quant_gemm import quantized_model

# (weights' bits, the output layer's bits, activations): what the draft can be made of
VARIANTS = [(4, 8, "float32"), (4, 8, "int8"), (4, 4, "int8"), (8, 8, "float32"), (8, 8, "int8")]


def top(model, text: torch.Tensor, keep: int) -> torch.Tensor:
    """The top token at each of the last ``keep`` positions but the last (the output layer runs on those only)."""
    return model(text, logits_to_keep=keep).logits[0, :-1].argmax(-1)


@torch.no_grad()
def agreement(model_override: list[str], per_category: int, tokens: int) -> str:
    with quiet_loading():
        target = load_checked_target(compose_config(model_override).model)
    model, tokenizer = target.model, target.tokenizer
    made = {v: quantized_model(model, *v) for v in VARIANTS}
    counts: dict[tuple, dict[str, list[int]]] = {v: {} for v in VARIANTS}
    questions = load_questions(per_category=per_category)
    start = time.monotonic()
    for n, question in enumerate(questions, 1):
        if getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question.turns[0]}],
                                                   add_generation_prompt=True, return_tensors="pt")
            prompt = getattr(prompt, "input_ids", prompt)
        else:  # a base model: the text itself, as the bench gives it
            prompt = tokenizer(question.turns[0], return_tensors="pt").input_ids
        text = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                              do_sample=False)
        keep = text.shape[1] - prompt.shape[1] + 1  # the positions whose next token the target wrote, and the last

        truth = top(model, text, keep)
        for variant, (copy, _, _) in made.items():
            same = int((top(copy, text, keep) == truth).sum())
            hits = counts[variant].setdefault(question.category, [0, 0])
            hits[0], hits[1] = hits[0] + same, hits[1] + len(truth)
        print(f"[{n}/{len(questions)}] {question.category} {time.monotonic() - start:.0f} s", file=sys.stderr)
    categories = list(dict.fromkeys(q.category for q in questions))
    lines = ["| weights / head / activations | all | " + " | ".join(categories) + " |",
             "|---|---|" + "---|" * len(categories)]
    for (bits, head, act), by in counts.items():
        total = [sum(h[i] for h in by.values()) for i in (0, 1)]
        lines.append(f"| int{bits} / int{head} / {act} | **{total[0] / total[1]:.3f}** ({total[0]}/{total[1]}) | "
                     + " | ".join(f"{by[c][0] / by[c][1]:.3f}" for c in categories) + " |")
    lines += ["", "Layers whose weights the copy holds exactly (the file's own codes): " + ", ".join(
        f"int{bits} / int{head}: {exact} of {layers}" for (bits, head, act), (_, layers, exact) in made.items()
        if act == "float32" or (bits, head) == (4, 4))]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    options = dict(a.split("=", 1) for a in argv if a.startswith(("per_category=", "tokens=")))
    model = [a for a in argv if a.startswith("model")]
    unknown = [a for a in argv if not a.startswith(("per_category=", "tokens=", "model"))]
    if unknown:
        raise ConfigError(f"agreement: {unknown} not understood; give model=..., per_category=N, tokens=N.")
    print(agreement(model, int(options.get("per_category", 5)), int(options.get("tokens", 64))))


if __name__ == "__main__":
    main(sys.argv[1:])
