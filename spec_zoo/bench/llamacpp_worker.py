"""llama.cpp's worker for the peer protocol (`spec_zoo.bench.peers`), through llama-cpp-python:
run by the python of its own venv (``make peer-llamacpp``), so it imports nothing of spec-zoo.

The protocol is ``peer_protocol.py``'s (next to it); the setup's ``model`` is a GGUF file,
``engine_args`` keyword arguments of ``llama_cpp.Llama`` plus ``speculative_config``.

``speculative_config: {method: prompt_lookup, num_pred_tokens, max_ngram_size}`` is llama.cpp's
prompt-lookup decoder (``LlamaPromptLookupDecoding``). llama-cpp-python keeps no speculative
counters, so this worker counts them: each ``Llama.eval`` call is one target forward (the prompt's
included, as a forward of plain decoding makes one token), so accepted = new tokens - forwards;
drafted sums the draft's proposals.
"""

from __future__ import annotations

import os
import time


def _llama(setup: dict, counts: dict):
    """The engine on the setup's GGUF with its draft (or none), counting forwards and drafted tokens
    into ``counts``."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

    class CountedDraft(LlamaDraftModel):
        def __init__(self, draft):
            self.draft = draft

        def __call__(self, input_ids, /, **kwargs):
            proposal = self.draft(input_ids, **kwargs)
            counts["drafted"] += len(proposal)
            return proposal

    args = dict(setup.get("engine_args") or {})
    speculation = args.pop("speculative_config", None)
    draft = None
    if speculation:
        method = speculation.get("method", "prompt_lookup")
        if method != "prompt_lookup":
            raise ValueError(f"speculative_config.method={method!r}; llama-cpp-python offers prompt_lookup")
        draft = CountedDraft(LlamaPromptLookupDecoding(num_pred_tokens=int(speculation.get("num_pred_tokens", 10)),
                                                       max_ngram_size=int(speculation.get("max_ngram_size", 2))))
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    args = {"n_ctx": 4096, "n_threads": threads, "n_threads_batch": threads, "seed": 0, "verbose": False, **args}
    if draft is not None:  # a draft reads every position's logits, but llama-cpp-python 0.3.36 sizes its logits
        args["logits_all"] = True  # buffer by the argument (n_batch rows): a prompt past 512 tokens overflowed it
    llm = Llama(model_path=setup["model"], draft_model=draft, **args)
    evaluate = llm.eval

    def counting_eval(tokens):
        counts["forwards"] += 1
        return evaluate(tokens)

    llm.eval = counting_eval  # generate() calls self.eval: the instance attribute wins
    return llm


def start(setup: dict):
    """llama.cpp on the setup's GGUF, and the function answering one request with it."""
    import llama_cpp

    counts = {"forwards": 0, "drafted": 0}
    llm = _llama(setup, counts)

    def generate(request: dict) -> dict:
        eos, budget = set(request.get("eos") or ()), request["max_new_tokens"]
        counts.update(forwards=0, drafted=0)
        out: list[int] = []
        llm.reset()  # no prefix reuse from the previous request (a repeat would be a cache hit)
        begin = time.perf_counter()
        for token in llm.generate(request["prompt_ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                  repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) >= budget or token in eos:
                break
        wall = time.perf_counter() - begin
        speculative = llm.draft_model is not None
        return {"output_ids": out, "wall_s": wall,
                "drafted": counts["drafted"] if speculative else None,
                "accepted": len(out) - counts["forwards"] if speculative else None}

    return llama_cpp.__version__, generate


if __name__ == "__main__":
    from peer_protocol import serve  # next to this script

    serve(start)
