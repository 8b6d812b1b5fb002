"""A stand-in peer engine speaking the worker protocol of `spec_zoo.bench.vllm_worker`, for the
adapter's tests (no vLLM in CI): its "greedy" output is a fixed function of the prompt; with a
``speculative_config`` it reports drafted/accepted counts, and with method ``broken`` its last
token differs from the plain output; a batch (``prompts``) is answered as its requests one by one;
``crash`` as the model dir makes it die while loading."""

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
        outs = []
        for prompt in request.get("prompts") or [request["prompt_ids"]]:  # a batch, or one request
            out = []
            for i in range(request["max_new_tokens"]):
                out.append((sum(prompt) + 3 * i) % 50 + 2)
                if out[-1] in request["eos"]:
                    break
            if speculation and speculation["method"] == "broken":
                out[-1] = out[-1] % 50 + 3
            outs.append(out)
        counts = {"drafted": None, "accepted": None}
        if speculation:
            counts = {"drafted": 2 * len(outs[0]), "accepted": len(outs[0]) // 2}
        wall = {"wall_s": 0.01 if speculation else 0.02}
        reply = {"outputs": outs} if "prompts" in request else {"output_ids": outs[0]}
        print(json.dumps({**reply, **wall, **counts}), flush=True)


main()
