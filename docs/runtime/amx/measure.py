"""t(M) of the embedded target, M = 1..64 after 100 / 500 / 1,500 cached tokens, on both runtimes and both
dtypes: compiled float32 (inductor's GEMM), compiled bfloat16 on the AMX GEMM (and on inductor's, for the
record), eager float32 and eager bfloat16 (oneDNN). The tables and the figure of docs/runtime.md's AMX
section. Run on an idle AMX host, one thread, pinned:

    OMP_NUM_THREADS=1 taskset -c 0 python docs/runtime/amx/measure.py docs/runtime/amx [fp32,amx,eager-fp32,eager-bf16]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from spec_zoo.api import compose_config, load_checked_target
from spec_zoo.costs import CostTable, measure
from spec_zoo.outputs import save_figure

VARIANTS = {  # name -> model overrides
    "fp32": ["model.runtime=compiled", "model.dtype=float32"],
    "bf16-inductor": ["model.runtime=compiled", "model.dtype=bfloat16"],
    "amx": ["model.runtime=compiled", "model.dtype=bfloat16", "model.gemm=amx"],
    "eager-fp32": ["model.runtime=eager", "model.dtype=float32"],
    "eager-bf16": ["model.runtime=eager", "model.dtype=bfloat16"],
}


def main(out: Path, names: list[str]) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name in names:
        cfg = compose_config(VARIANTS[name])
        target = load_checked_target(cfg.model)
        if hasattr(target, "warm_up"):  # the compiled runtime: compiling is not scoring
            start = time.perf_counter()
            target.warm_up()
            print(f"{name}: compiled in {time.perf_counter() - start:.0f} s (cached: {target.compile_cached})",
                  flush=True)
        table = measure(target, max_tokens=64, repeats=5)
        table.save(out / f"{name}.json")
        tables[name] = table
        for past, curve in table.curves().items():
            ratios = " ".join(f"t({m})/t(1)={curve[m - 1] / curve[0]:.2f}" for m in (4, 8, 16, 32, 64))
            print(f"{name} after {past}: t(1)={curve[0] * 1e3:.1f} ms {ratios}", flush=True)
    plot(out)


def plot(out: Path) -> None:
    """t(M) in ms against M, one panel per context, one line per measured variant (every table in ``out``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = {name: CostTable.load(out / f"{name}.json") for name in VARIANTS if (out / f"{name}.json").exists()}
    contexts = sorted({past for table in tables.values() for past in table.curves()})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4 * len(contexts), 3.4), sharey=True, squeeze=False)
    for ax, past in zip(axes[0], contexts):
        for name, table in tables.items():
            if (seconds := table.curves().get(past)) is not None:
                ax.plot(range(1, len(seconds) + 1), [s * 1e3 for s in seconds], marker="o", markersize=2, label=name)
        ax.set_title(f"after {past} cached tokens", fontsize=9)
        ax.set_xlabel("tokens scored in one forward (M)")
    axes[0][0].set_ylabel("t(M), ms (medians; 1 thread)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "t_of_m.png", 120)
    plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else ["fp32", "amx"])
