"""The vLLM side of the peer protocol (`spec_zoo.bench.peers`): run by the python of vLLM's own
venv (``make peer-vllm``), so it imports nothing of spec-zoo, only the standard library and vLLM.

Protocol, one JSON object per line: the first line read is the setup (``model``: a Hugging Face
model dir, ``dtype``, ``engine_args``: keyword arguments of ``vllm.LLM`` such as
``speculative_config``); it answers ``{"ready": true, "version": ...}``. Then each request
``{"prompt_ids", "max_new_tokens", "eos"}`` is answered ``{"output_ids", "wall_s", "drafted",
"accepted"}`` (greedy; ``wall_s`` times ``LLM.generate`` alone; drafted / accepted: vLLM's
speculative-decoding counters over this request, null without speculation). Any failure is
answered ``{"error": "..."}``. vLLM's own prints go to stderr: stdout carries the protocol only.
"""

from __future__ import annotations

import json
import os
import sys
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


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # everything else printed (vLLM's logs, C-level prints included) goes to stderr

    def answer(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")

    try:
        setup = json.loads(sys.stdin.readline())
        import vllm
        from vllm.inputs import TokensPrompt

        args = {"max_model_len": 4096, "enforce_eager": False, "disable_log_stats": False,
                **setup.get("engine_args", {})}
        llm = vllm.LLM(model=setup["model"], dtype=setup.get("dtype", "float32"), seed=0, **args)
        speculative = bool(args.get("speculative_config"))
    except Exception as err:
        answer({"error": f"{type(err).__name__}: {err}".splitlines()[0]})
        return
    answer({"ready": True, "version": vllm.__version__})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            params = vllm.SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"],
                                         stop_token_ids=request.get("eos") or None, detokenize=False)
            before = _spec_counters(llm) if speculative else None
            start = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=request["prompt_ids"])], params, use_tqdm=False)
            wall = time.perf_counter() - start
            counts = {"drafted": None, "accepted": None}
            if before is not None:
                after = _spec_counters(llm)
                counts = {k: None if before[k] is None else after[k] - before[k] for k in after}
            answer({"output_ids": list(out[0].outputs[0].token_ids), "wall_s": wall, **counts})
        except Exception as err:
            answer({"error": f"{type(err).__name__}: {err}".splitlines()[0]})


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from rerunning this
    main()
