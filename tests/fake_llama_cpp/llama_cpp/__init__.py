"""A stand-in for llama-cpp-python (not installed in CI) with the shape of its speculative loop:
`Llama.generate` evaluates the pending tokens plus the draft's proposal in one `eval` (one
forward), yields its greedy tokens while they match the proposal, and stops at the first that
does not. Its "model": the next token is a fixed function of the last one, so prompt lookup hits."""

__version__ = "fake"


class Llama:
    def __init__(self, model_path, draft_model=None, **kwargs):
        self.draft_model, self.input_ids, self.n_tokens = draft_model, [], 0

    @staticmethod
    def _next(token: int) -> int:
        return (token * 7 + 3) % 11 + 2

    def reset(self):
        self.n_tokens = 0
        self.input_ids = []

    def eval(self, tokens):
        self.input_ids = self.input_ids[: self.n_tokens] + list(tokens)
        self.n_tokens = len(self.input_ids)

    def generate(self, tokens, reset=True, **sampling):
        if reset:
            self.reset()
        tokens = list(tokens)
        sample_idx = self.n_tokens + len(tokens) - 1
        while True:
            self.eval(tokens)
            while sample_idx < self.n_tokens:
                token = self._next(self.input_ids[sample_idx])
                sample_idx += 1
                yield token
                tokens = [token]
                if sample_idx < self.n_tokens and token != self.input_ids[sample_idx]:
                    self.n_tokens = sample_idx  # the rest of the proposal is rejected
                    break
            if self.draft_model is not None:
                tokens += [int(t) for t in self.draft_model(self.input_ids[: self.n_tokens] + tokens)]
