"""t(M) of the target under one runtime setting, appended to levers.jsonl (docs/runtime.md,
"Levers"). One setting per process, so each compiles afresh:

    OMP_NUM_THREADS=1 python docs/runtime/levers.py NAME model.runtime=compiled model.gemm_backends=ATEN [past=P]
"""

import json
import sys
import time

import torch

from spec_zoo.api import compose_config, load_checked_target
from spec_zoo.costs import measure

name, args = sys.argv[1], sys.argv[2:]
past = next((int(a.split("=")[1]) for a in args if a.startswith("past=")), 100)
overrides = [a for a in args if not a.startswith("past=")]
start = time.perf_counter()
target = load_checked_target(compose_config(overrides).model)
if hasattr(target, "warm_up"):
    target.warm_up()
compile_s = time.perf_counter() - start
table = measure(target, max_tokens=8, repeats=7, contexts=(past,), progress=False)
row = {"name": name, "overrides": args, "threads": torch.get_num_threads(), "past": past,
       "compile_s": round(compile_s, 1), "ms": [round(s * 1e3, 2) for s in table.seconds], "runtime": target.runtime}
print(json.dumps(row))
with open("levers.jsonl", "a") as out:
    out.write(json.dumps(row) + "\n")
