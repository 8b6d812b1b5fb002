"""Peer engines the bench can measure beside spec-zoo (``engine: vllm|llamacpp`` in a method spec): what
each needs to run in its own virtual environment (a venv made by a documented command, never
part of spec-zoo's install, since each pins its own torch), checked before any model loads.

A peer method's ``params`` are the engine's own arguments (for vLLM, keyword arguments of
``vllm.LLM`` such as ``speculative_config``; for llama.cpp, of ``llama_cpp.Llama``) plus ``venv``,
the environment's directory, and for an engine that reads a GGUF file, ``model_path``.
`spec_zoo.bench.peer_method` runs the engine's worker script there (docs/peers.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spec_zoo.errors import ConfigError

#: where Debian's libtcmalloc-minimal4 puts tcmalloc, which vLLM's CPU build asks to have preloaded
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


@dataclass(frozen=True)
class PeerEngine:
    """A serving engine run in its own venv through a worker script speaking the peer protocol."""

    name: str
    worker: str  # the script the venv's python runs (a name: next to this module)
    venv: str  # the default venv directory (relative to the working directory); SPEC_ZOO_<NAME>_VENV overrides it
    install: str  # the command that makes that venv
    speculation_key: str  # the engine argument that turns speculation on
    reads_gguf: bool = False  # the engine loads a GGUF file (params.model_path), not the target's model dir
    batches: bool = False  # its worker decodes a list of prompts side by side (the protocol's "prompts")

    def python(self, params: Mapping) -> Path:
        venv = params.get("venv") or os.environ.get(f"SPEC_ZOO_{self.name.upper()}_VENV") or self.venv
        return Path(venv).expanduser() / "bin" / "python"

    def worker_path(self) -> Path:
        return Path(__file__).parent / self.worker

    def engine_args(self, params: Mapping) -> dict:
        """The engine's own arguments: ``params`` without ``venv`` and ``model_path``."""
        return {k: v for k, v in params.items() if k not in ("venv", "model_path")}

    def model(self, params: Mapping, target_dir: str, method: str) -> str:
        """What the worker loads: the bench target's model dir, or for a GGUF engine ``params.model_path``
        or, for an embedded target (a converted GGUF), the very GGUF it was converted from."""
        if not self.reads_gguf:
            return target_dir
        from spec_zoo.models import embedded_gguf_of

        given = params.get("model_path")
        path = Path(given).expanduser() if given else embedded_gguf_of(target_dir)
        if path is None:
            raise ConfigError(f"method {method}: {self.name} loads a GGUF file and the target {target_dir} is not "
                              "one spec-zoo converted from a GGUF; set params.model_path to the target's GGUF.")
        return str(path)

    def drafter_label(self, params: Mapping) -> str:
        """What a record names as the drafter: the engine's speculative method, or ``none``."""
        speculation = params.get(self.speculation_key)
        return str(speculation.get("method", "speculative")) if isinstance(speculation, Mapping) else "none"

    def check(self, params: Mapping, method: str) -> None:
        """The venv (and a GGUF engine's ``model_path``, when given) is there, or one line saying how to fix it;
        called while methods resolve, before any model loads."""
        python = self.python(params)
        if not python.is_file():
            raise ConfigError(f"method {method}: the {self.name} environment is missing ({python} not found); make it "
                              f"with `{self.install}` (docs/peers.md), or point params.venv at one.")
        given = params.get("model_path")
        if self.reads_gguf and given and not Path(given).expanduser().is_file():
            raise ConfigError(f"method {method}: params.model_path={given} is not a file; point it at a GGUF.")

    def environment(self, params: Mapping, threads: int) -> dict:
        """The worker's environment: ``threads`` compute threads, and what the engine needs preloaded."""
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        if self.name == "vllm":
            venv = self.python(params).parent.parent
            preload = [p for p in (TCMALLOC, str(venv / "lib" / "libiomp5.so")) if Path(p).is_file()]  # intel-openmp
            env.update(LD_PRELOAD=":".join(preload), VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine in the worker
                       VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
        return env


PEERS = {
    "vllm": PeerEngine("vllm", "vllm_worker.py", ".venv-vllm", "make peer-vllm", "speculative_config", batches=True),
    "llamacpp": PeerEngine("llamacpp", "llamacpp_worker.py", ".venv-llamacpp", "make peer-llamacpp",
                           "speculative_config", reads_gguf=True),
}
