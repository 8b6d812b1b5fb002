"""t(M) of the embedded target on the compiled runtime, float32 (inductor's GEMM) against bfloat16 on the
AMX GEMM, M = 1..64 after 100 / 500 / 1,500 cached tokens: the tables and the figure of docs/runtime.md's
AMX section. Run on an idle AMX host, one thread, pinned:

    OMP_NUM_THREADS=1 taskset -c 0 python docs/runtime/amx/measure.py docs/runtime/amx [fp32,amx]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from spec_zoo.api import compose_config, load_checked_target
from spec_zoo.costs import measure, plot_table

VARIANTS = {  # name -> model overrides
    "fp32": ["model.dtype=float32"],
    "bf16-inductor": ["model.dtype=bfloat16"],
    "amx": ["model.dtype=bfloat16", "model.gemm=amx"],
}


def main(out: Path, names: list[str]) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name in names:
        cfg = compose_config(["model.runtime=compiled", *VARIANTS[name]])
        target = load_checked_target(cfg.model)
        start = time.perf_counter()
        target.warm_up()
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s (cached: {target.compile_cached})", flush=True)
        table = measure(target, max_tokens=64, repeats=5)
        table.save(out / f"{name}.json")
        tables[name] = table
        for past, curve in table.curves().items():
            ratios = " ".join(f"t({m})/t(1)={curve[m - 1] / curve[0]:.2f}" for m in (4, 8, 16, 32, 64))
            print(f"{name} after {past}: t(1)={curve[0] * 1e3:.1f} ms {ratios}", flush=True)
    first, *others = tables.values()
    plot_table(first, out / "t_of_m.png", others)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else ["fp32", "amx"])
