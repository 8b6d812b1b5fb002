"""Draft with a causal LM of another tokenizer: through text (string-level matching).

``small_model`` needs the target's vocabulary; this drafter talks to its draft model in text
instead. Each step it decodes the committed target tokens to text, re-tokenizes that
text into the draft's vocabulary (the draft's KV cache follows the shared prefix, as
``small_model``'s does, through `Target.score`), then drafts: by its argmax, decoding the new
tokens to text and re-tokenizing that continuation into the target's vocabulary, or, when
sampling, by token-level intersection. Either way a chain `Draft` in target ids.

Why it is lossless:

- greedy: a verifier that accepts a token only where it is the target's own argmax commits
  plain greedy decoding whatever the proposal, so any chain of target ids is safe. The care
  is for acceptance, at the boundaries: the draft's text must continue the committed text
  exactly (else nothing is proposed), and the last target token of the continuation is
  dropped, since more text could merge it into another token.
- sampling, construction (a), a deterministic draft (``sample=false``): the draft is the draft
  model's argmax chain, a function of the committed tokens alone, so q is one-hot
  (``probs=None``). The rejection rule then accepts node x_i with probability p_i(x_i) and
  otherwise samples from p_i with x_i removed, renormalised: the committed token is y with
  probability p_i(x_i)[y = x_i] + (1 - p_i(x_i)) p_i(y) / (1 - p_i(x_i))[y != x_i] = p_i(y).
  Along a chain node i + 1 is examined only after x_i was committed, when its context is the
  committed prefix, so by induction every committed token follows p given what precedes it.
  (The same holds for any draft drawn independently of the verifier's randomness.)
- sampling, construction (b), token-level intersection (TLI, "Lossless speculative decoding
  with heterogeneous vocabularies", ``sample=auto`` at temperature > 0): the draft model's
  distribution is restricted to the tokens whose text is one token in both vocabularies,
  renormalised and mapped to target ids; the chain is sampled from it token by token and each
  row of q is passed, so the standard rejection rule is exact, with q close to the draft's own
  distribution (higher acceptance than a one-hot q). Passing the draft's unrestricted
  distribution instead would misstate q (a merged token's text also starts with its first
  character); tests/test_cross_tokenizer.py shows certification catching that.
"""

from __future__ import annotations

import torch

from spec_zoo.costs import file_costs
from spec_zoo.draft import Draft
from spec_zoo.draft_length import DraftLength
from spec_zoo.errors import ConfigError
from spec_zoo.interfaces import DecodeState
from spec_zoo.runtime.target import Target
from spec_zoo.sampling import check_sample_mode, drafts_sampled, to_full_vocab

from .small_model import DraftModelSequences, draft_runner


class CrossTokenizerDrafter(DraftModelSequences):
    """A chain drafted by a causal LM of any vocabulary, re-tokenized into the target's.

    path:             the draft model: a local HF model directory (with its tokenizer), a loaded
                      model, or a `Target` wrapping one; None: ``small_model``'s default draft (the
                      default target's first ``draft_layers`` layers, the same vocabulary: a check of
                      the text path, not a reason to use it).
    draft_tokenizer:  the draft model's tokenizer when ``path`` does not carry one (a loaded model).
    target_tokenizer: the target's tokenizer when the target carries none (a bare model).
    num_draft:        draft-model tokens generated per step (the starting length when ``adaptive``);
                      the proposal has as many target tokens as that text makes, less the last.
    sample:           "auto" drafts by TLI when temperature > 0 and through text at 0; True forces
                      TLI, False text drafting (deterministic, q one-hot) at every temperature.
    Both are exact under greedy and rejection verification.
    """

    name = "cross_tokenizer"

    def __init__(
        self,
        path=None,
        draft_tokenizer=None,
        target_tokenizer=None,
        num_draft: int = 4,
        adaptive: bool = False,
        max_draft: int = 16,
        token_cost: float = 0.3,
        learn_cost: bool = True,
        sample: str | bool = "auto",
        dtype: str = "float32",
        device: str = "cpu",
        draft_layers: int = 4,
        runtime: str = "eager",
    ):
        self.length = DraftLength(num_draft, adaptive, max_draft, token_cost, learn_cost)
        self.sample_mode = check_sample_mode(sample)
        self.runner, self.source = draft_runner(path, dtype, device, draft_layers, runtime)
        self.draft_tok = draft_tokenizer or self.runner.tokenizer
        self.target_tok = target_tokenizer

    def attach(self, target: Target) -> None:
        self.target_tok = self.target_tok or target.tokenizer
        if self.draft_tok is None or self.target_tok is None:
            missing = "draft model" if self.draft_tok is None else "target"
            raise ConfigError(f"drafter=cross_tokenizer drafts through text but the {missing} has no tokenizer; "
                              f"pass drafter.{'draft' if self.draft_tok is None else 'target'}_tokenizer=.")
        self.target_vocab = target.vocab_size
        self.shared_draft_ids, self.shared_target_ids = self._intersection()
        file_costs(self)

    def _intersection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft ids, target ids) of the texts that are one token in both vocabularies, one pair
        per text (special tokens left out): TLI's vocabulary."""
        def texts(tokenizer, size: int) -> list[str]:
            return tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)

        special = set(self.target_tok.all_special_ids)
        target_of: dict[str, int] = {}
        for i, text in enumerate(texts(self.target_tok, min(len(self.target_tok), self.target_vocab))):
            if text and "\ufffd" not in text and i not in special:  # not a partial character
                target_of.setdefault(text, i)
        pairs: dict[int, int] = {}  # target id -> the first draft id of its text
        special = set(self.draft_tok.all_special_ids)
        for d, text in enumerate(texts(self.draft_tok, min(len(self.draft_tok), self.runner.vocab_size))):
            if d not in special and text in target_of:
                pairs.setdefault(target_of[text], d)
        if not pairs:
            raise ConfigError(f"drafter.path={self.source}: no token's text is one token in both vocabularies, so "
                              "token-level intersection cannot sample; set drafter.sample=false (text drafting).")
        return torch.tensor(list(pairs.values())), torch.tensor(list(pairs))

    def _text(self, tokenizer, ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _draft(self, state: DecodeState) -> Draft:
        committed = self._text(self.target_tok, state.tokens)
        mine = self.draft_tok.encode(committed, add_special_tokens=False)
        if not mine or self._text(self.draft_tok, mine) != committed:
            return Draft.empty()  # the draft vocabulary cannot spell this text: no shared prefix to continue
        steps = self.length.choose(state=state)
        if min(steps, state.max_depth) < 1:
            return Draft.empty()
        if drafts_sampled(self.sample_mode, state.sampling):
            return self._intersection_chain(state, mine, min(steps, state.max_depth))
        drafted = list(mine)
        for _ in range(min(steps, state.max_depth + 1)):  # one more: the last target token is dropped
            logits = self.runner.score(drafted, Draft.empty()).logits[-1]
            drafted.append(int(logits.argmax()))
        text = self._text(self.draft_tok, drafted)
        if not text.startswith(committed):
            return Draft.empty()  # the draft's text rewrites the committed text: nothing continues it
        ours = self.target_tok.encode(text[len(committed):], add_special_tokens=False)
        # the last token may merge with text still to come (its retokenization may change): drop it
        return Draft.chain(ours[: min(len(ours) - 1, state.max_depth)]) if len(ours) > 1 else Draft.empty()

    def _intersection_chain(self, state: DecodeState, mine: list[int], steps: int) -> Draft:
        """TLI: each token sampled from the draft's distribution restricted to the shared texts,
        as target ids, with its q row (`ChainDrafter.draft_chain`)."""
        drafted = list(mine)
        draft_of = dict(zip(self.shared_target_ids.tolist(), self.shared_draft_ids.tolist()))

        def logits_after(tokens: list[int]) -> torch.Tensor:
            logits = self.runner.score(tokens, Draft.empty()).logits[-1]
            return to_full_vocab(logits[self.shared_draft_ids], self.shared_target_ids, self.target_vocab)

        def advance(token: int, more: bool) -> torch.Tensor:
            drafted.append(draft_of[token])
            return logits_after(drafted)

        return self.draft_chain(state, logits_after(drafted), steps, advance)
