"""Time to first token of a fresh process on the compiled runtime, t(1..4), and a digest of
the first scored chain's logits: run twice with the same TORCHINDUCTOR_CACHE_DIR (issue 29).
The clock starts before torch is imported (the imports count towards the first token)."""

import time

START = time.perf_counter()


def main(repeats: int) -> None:
    import hashlib
    import json
    import os

    import torch

    from spec_zoo.costs import measure
    from spec_zoo.draft import Draft
    from spec_zoo.models import load_target

    torch.set_num_threads(1)
    target = load_target(runtime="compiled")
    loaded = time.perf_counter() - START
    compile_s = target.warm_up()
    prompt = target.tokenizer("Write a short poem about caches.")["input_ids"]
    target.reset()
    logits = target.score(prompt, Draft.chain([11, 12, 13])).logits
    first = time.perf_counter() - START
    table = measure(target, max_tokens=4, repeats=repeats, progress=False)
    print(json.dumps({"load_s": round(loaded, 1), "compile_s": round(compile_s, 1), "hit": target.compile_cached,
                      "first_token_s": round(first, 1), "t_ms": [round(s * 1e3, 2) for s in table.seconds],
                      "logits_sha": hashlib.sha256(logits.numpy().tobytes()).hexdigest()[:16],
                      "load": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    import sys

    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
