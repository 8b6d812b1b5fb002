"""vLLM's worker for the peer protocol (``peer_protocol.py``, next to it): run by the python of vLLM's
own venv (``make peer-vllm``), so it imports nothing of spec-zoo, only the standard library and vLLM.

The setup's ``model`` is a Hugging Face model dir, ``engine_args`` keyword arguments of ``vllm.LLM``
(such as ``speculative_config``); drafted / accepted are vLLM's speculative-decoding counters.
"""

from __future__ import annotations

import time

_COUNTERS = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted"}


def _spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters so far (drafted and accepted tokens; null when it keeps none)."""
    totals: dict[str, int | None] = {"drafted": None, "accepted": None}
    try:
        metrics = llm.get_metrics()
    except Exception:
        return totals
    for metric in metrics:
        if metric.name in _COUNTERS:
            key = _COUNTERS[metric.name]
            totals[key] = (totals[key] or 0) + int(getattr(metric, "value", 0))
    return totals


def start(setup: dict):
    """vLLM on the setup's model dir, and the function answering one request with it."""
    import vllm
    from vllm.inputs import TokensPrompt

    args = {"max_model_len": 4096, "enforce_eager": False, "disable_log_stats": False, **setup.get("engine_args", {})}
    llm = vllm.LLM(model=setup["model"], dtype=setup.get("dtype", "float32"), seed=0, **args)
    speculative = bool(args.get("speculative_config"))

    def generate(request: dict) -> dict:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"],
                                     stop_token_ids=request.get("eos") or None, detokenize=False)
        before = _spec_counters(llm) if speculative else None
        prompts = request["prompts"] if "prompts" in request else [request["prompt_ids"]]  # a batch: side by side
        begin = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - begin
        counts = {"drafted": None, "accepted": None}
        if before is not None:
            after = _spec_counters(llm)
            counts = {k: None if before[k] is None else after[k] - before[k] for k in after}
        outputs = [list(o.outputs[0].token_ids) for o in out]
        if "prompts" in request:
            return {"outputs": outputs, "wall_s": wall, **counts}
        return {"output_ids": outputs[0], "wall_s": wall, **counts}

    return vllm.__version__, generate


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from rerunning this
    from peer_protocol import serve  # next to this script

    serve(start)
