"""One linear shape (gate/up: 576 -> 1536), 24 distinct weights cycled so they come from memory,
M = 1..16 and 32 interleaved over rounds: the skinny GEMM (weights packed once, as freezing does),
MKL (eager F.linear) and inductor's CPP GEMM compiled as the runtime compiles it (frozen, the row
count dynamic, one row padded to 2). Thread CPU time by default (CLOCK=wall for wall time), so
other jobs' preemption is not counted. docs/runtime.md, "The skinny GEMM".

    OMP_NUM_THREADS=1 python docs/runtime/skinny_micro.py   # OUT=file.json, R=rounds, N=, K=
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config

from spec_zoo.runtime import skinny_gemm


class Linears(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False) for w in weights])

    def forward(self, x):
        return [F.linear(x, w) for w in self.ws]


def main():
    torch.set_num_threads(1)
    n, k, rounds = int(os.environ.get("N", 1536)), int(os.environ.get("K", 576)), int(os.environ.get("R", 7))
    clock = time.perf_counter if os.environ.get("CLOCK") == "wall" else time.thread_time
    weights = [torch.randn(n, k) * 0.02 for _ in range(24)]
    with torch.no_grad(), inductor_config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP"):
        inductor = torch.compile(Linears(weights).eval(), fullgraph=True)
        x = torch.randn(1, 3, k)
        torch._dynamo.mark_dynamic(x, 1, min=2, max=2047)
        inductor(x)
    packed = [skinny_gemm.pack(w, *skinny_gemm.layout()) for w in weights]
    impls = {"skinny": lambda x: [torch.ops.spec_zoo.skinny_linear(x, p, n) for p in packed],
             "mkl": lambda x: [F.linear(x, w) for w in weights], "inductor": inductor}
    rows = list(range(1, 17)) + [32]
    xs = {m: torch.randn(1, m, k) for m in rows}
    times = {(i, m): [] for i in impls for m in rows}
    loads = []
    with torch.no_grad():
        for r in range(rounds + 1):  # round 0 warms every shape
            for m in rows:
                for name, fn in impls.items():
                    x = xs[max(m, 2)] if name == "inductor" else xs[m]
                    start = clock()
                    fn(x)
                    if r:
                        times[(name, m)].append(clock() - start)
            loads.append(os.getloadavg()[0])
    ms = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"N={n} K={k}, 24 weights, {rounds} rounds, load1 per round: {[round(x, 1) for x in loads]}", file=sys.stderr)
    for m in rows:
        print(m, *(f"{ms[(i, m)]:.2f} ms ({ms[(i, m)] / ms[(i, 1)]:.2f})" for i in impls), sep=" | ")
    record = {"N": n, "K": k, "rounds": rounds, "clock": clock.__name__, "load1": loads,
              "ms": {f"{i}/{m}": ms[(i, m)] for i in impls for m in rows}}
    if "OUT" in os.environ:
        Path(os.environ["OUT"]).write_text(json.dumps(record) + "\n")
    else:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
