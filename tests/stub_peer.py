"""A stand-in peer engine speaking the worker protocol of `spec_zoo.bench.vllm_worker`, for the
adapter's tests (no vLLM in CI): its "greedy" output is a fixed function of the prompt; with a
``speculative_config`` it reports drafted/accepted counts, and with method ``broken`` its last
token differs from the plain output; ``crash`` as the model dir makes it die while loading."""

import json
import sys


def main() -> None:
    setup = json.loads(sys.stdin.readline())
    if setup["model"] == "crash":
        print("stub: cannot load the model", file=sys.stderr)
        sys.exit(3)
    speculation = setup["engine_args"].get("speculative_config")
    print(json.dumps({"ready": True, "version": "stub"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        out = []
        for i in range(request["max_new_tokens"]):
            out.append((sum(request["prompt_ids"]) + 3 * i) % 50 + 2)
            if out[-1] in request["eos"]:
                break
        counts = {"drafted": None, "accepted": None}
        if speculation:
            counts = {"drafted": 2 * len(out), "accepted": len(out) // 2}
            if speculation["method"] == "broken":
                out[-1] = out[-1] % 50 + 3
        print(json.dumps({"output_ids": out, "wall_s": 0.01 if speculation else 0.02, **counts}), flush=True)


main()
