"""The fake's draft models: the interface of llama-cpp-python's, and a prompt lookup that proposes
what followed the last token's latest earlier occurrence."""


class LlamaDraftModel:
    def __call__(self, input_ids, /, **kwargs):
        raise NotImplementedError


class LlamaPromptLookupDecoding(LlamaDraftModel):
    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.num_pred_tokens = num_pred_tokens

    def __call__(self, input_ids, /, **kwargs):
        ids = list(input_ids)
        for start in range(len(ids) - 2, -1, -1):
            if ids[start] == ids[-1]:
                return ids[start + 1: start + 1 + self.num_pred_tokens]
        return []
