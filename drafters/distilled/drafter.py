"""``drafter=distilled``: a draft model distilled from the target (`spec-zoo-train distill`).

A thin preset over `SmallModelDrafter` (same chain / tree / adaptive options) that

* loads a distilled-draft directory (HF model dir + ``distill.json``), by default the one
  shipped for SmolLM2-135M (``drafters/distilled/artefacts/smollm2-135m-distilled``);
* refuses a draft distilled for another target, or corrupt files, with a clear message;
* plugs the target's input embeddings in (the artefact does not duplicate them);
* maps a reduced draft vocabulary back to the target's: logits outside it are -inf, so
  q is exactly zero there and exact verifiers (greedy, rejection sampling) stay exact.

``untrained=True`` rebuilds the same architecture from the target as it was *before*
distillation (the benchmark's ``draft_untrained`` baseline).
"""

from __future__ import annotations

from pathlib import Path

import torch

from spec_zoo.costs import file_costs
from spec_zoo.drafters.small_model import SmallModelDrafter
from spec_zoo.errors import ConfigError
from spec_zoo.models import other_vocabulary
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import to_full_vocab

SHIPPED = Path(__file__).parent / "artefacts" / "smollm2-135m-distilled"


class DistilledDrafter(SmallModelDrafter):
    """path: a distilled-draft dir (None = the shipped SmolLM2-135M draft); untrained: use
    the draft's initialisation instead of its trained weights (an ablation baseline);
    ``options`` (num_draft, adaptive, sample, tree, ...) as in `SmallModelDrafter`."""

    name = "distilled"

    def __init__(self, path=None, untrained: bool = False, dtype: str = "float32", device: str = "cpu", **options):
        from spec_zoo.drafters.distilled.student import load_artefact

        self.path = Path(path).expanduser() if path else SHIPPED
        if path is None and not (SHIPPED / "distill.json").is_file():
            raise ConfigError(f"the shipped distilled draft is missing ({SHIPPED}); reinstall spec-zoo, or set "
                              "drafter.path=DIR to a draft made with `spec-zoo-train distill`.")
        model, tokenizer, self.record = load_artefact(self.path, dtype=dtype, device=device)
        super().__init__(model, dtype=dtype, device=device, **options)
        self.runner.tokenizer = tokenizer
        self.source = str(self.path)
        vocab = self.record.get("draft_vocab")
        self.vocab_ids = None if vocab is None else torch.tensor(vocab, dtype=torch.long, device=model.device)
        self.untrained = bool(untrained)
        if self.untrained and (self.record.get("init") or {}).get("kind") != "target":
            raise ConfigError("drafter.untrained=true needs a draft initialised from the target (student.init=target); "
                              f"{self.path} was initialised with {(self.record.get('init') or {}).get('kind')!r}.")
        self.full_vocab: int | None = None
        self._attached_to: object = None  # the target attached last (attach is idempotent for it)

    def attach(self, target: Target) -> None:
        from spec_zoo.artefacts import check_target
        from spec_zoo.drafters.distilled.student import check_embeddings, student_from_target

        if self._attached_to is target:
            return
        check_target(self.record, target.model, self.path)
        if other_vocabulary(self.runner.tokenizer, target.tokenizer):
            raise ConfigError(f"drafter.path={self.source} has a different tokenizer than the target; "
                                  "a draft must share the target's tokenizer.")
        draft = self.runner.model
        self.full_vocab = target.vocab_size
        if self.vocab_ids is None and self.runner.vocab_size != target.vocab_size:
            raise ConfigError(f"drafter.path={self.source} has {self.runner.vocab_size} output tokens and no draft "
                              f"vocabulary, but the target has {target.vocab_size}; "
                              "the draft does not fit this target.")
        if self.vocab_ids is not None and int(self.vocab_ids.max()) >= target.vocab_size:
            raise ConfigError(f"drafter.path={self.source}: its draft vocabulary has ids beyond the target's "
                              f"{target.vocab_size} tokens; it was made for another target.")
        if self.untrained:
            init = self.record["init"]
            fresh = student_from_target(target.model, int(init["layers"]), init.get("copy_layers"),
                                        None if self.vocab_ids is None else self.vocab_ids.cpu())
            state = {k: v for k, v in fresh.lm.state_dict().items() if "embed_tokens" not in k}
            draft.load_state_dict(state, strict=False)
        if self.record.get("input_embeddings") == "target":
            embed = target.model.get_input_embeddings()
            check_embeddings(self.record, embed, "drafter.path", self.path)
            if embed.weight.dtype != draft.dtype or embed.weight.device != draft.device:
                embed = torch.nn.Embedding.from_pretrained(embed.weight.detach().to(draft.device, draft.dtype))
            draft.model.embed_tokens = embed  # shared with the target: no second copy of the full table
        file_costs(self)
        self._attached_to = target

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_ids is None:
            return logits
        if self.full_vocab is None:
            raise RuntimeError("DistilledDrafter.attach(target) must be called before drafting")
        return to_full_vocab(logits, self.vocab_ids, self.full_vocab)
