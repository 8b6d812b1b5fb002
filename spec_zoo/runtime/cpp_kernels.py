"""Building spec-zoo's C++ kernels: compiled on first use for this CPU, then cached.

Each kernel is one source file beside this module (with the shared `simd.h`), built with
``-march=native`` (AVX-512, AVX2 or a portable path) under `spec_zoo.paths.cache_root` /
``kernels``, keyed by its source, the CPU's flags and the torch version, so a shared cache never
hands one machine another's build. ``-ffp-contract=off``: the compiler fuses no multiply-add the
source does not write, so a sum's bits are the source's.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from spec_zoo.errors import ConfigError, first_line
from spec_zoo.paths import cache_root

HERE = Path(__file__).parent
SHARED = ("simd.h",)  # headers every kernel includes


def cpu_flags() -> str:
    """This CPU's feature flags (what -march=native compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_isa() -> str:
    """The widest matrix or vector unit this CPU offers spec-zoo's kernels and PyTorch's: ``amx``
    (AMX-BF16 tiles), ``avx512-bf16``, ``avx512``, ``avx2`` or ``portable``. Recorded beside every
    timing (cost tables, bench records), since which one ran decides what a figure means."""
    flags = set(cpu_flags().split())
    for isa, flag in (("amx", "amx_bf16"), ("avx512-bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return isa
    return "portable"


def build(source: str, setting: str, fix: str) -> None:
    """Build and load ``source`` (a .cpp file beside this module) as a torch library; a missing
    compiler or a failed build is a `ConfigError` naming ``setting`` and the ``fix``."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise ConfigError(f"{setting} builds a C++ kernel on first use, but no compiler ({compiler}) is on PATH; "
                          f"install one (e.g. apt-get install g++) or {fix}.")
    from torch.utils import cpp_extension

    path = HERE / source
    text = path.read_text() + "".join((HERE / header).read_text() for header in SHARED)
    tag = hashlib.sha256((text + cpu_flags() + torch.__version__).encode()).hexdigest()[:12]
    name = f"spec_zoo_{path.stem}_{tag}"
    directory = cache_root() / "kernels" / name
    directory.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(name, sources=[str(path)], extra_cflags=["-O3", "-march=native", "-ffp-contract=off"],
                           extra_include_paths=[str(HERE)], build_directory=str(directory),
                           is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as err:
        raise ConfigError(f"{setting}: building its C++ kernel in {directory} failed ({first_line(err)}); "
                          f"{fix}.") from None


class RoutedLinears(TorchFunctionMode):
    """While active (and while dynamo traces under it), ``F.linear`` without a bias on a 2-D weight
    and an input of ``dtype`` runs ``linear(x, weight)`` (one of spec-zoo's GEMMs, built and laid out
    before any tracing: dynamo must not trace a build); any other linear runs as it would."""

    def __init__(self, dtype: torch.dtype, linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.dtype, self.linear = dtype, linear

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if bias is None and weight.dtype == self.dtype and x.dtype == self.dtype and weight.dim() == 2:
                return self.linear(x, weight)
        return func(*args, **kwargs)
