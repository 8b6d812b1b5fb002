"""`PeerMethod`: a peer engine (`spec_zoo.bench.peers`) behind the bench's `Method.run`, run in a
worker subprocess with the engine's own venv and spoken to in JSON lines (the protocol is in
``vllm_worker.py``): the same prompt token ids, greedy, the same token budget and EOS set.

The worker starts when the method is built (vLLM takes over a minute), so several engines
start together; the first `run` waits for it. It times generation itself (``wall_s``), so the
pipe's cost stays out of the timings, as the spec-zoo methods time their own loop.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
from collections.abc import Sequence

import torch

from spec_zoo.bench.methods import Measurement, Method
from spec_zoo.bench.peers import PEERS
from spec_zoo.bench.specs import MethodSpec
from spec_zoo.errors import ConfigError
from spec_zoo.runtime.target import Target


class PeerMethod(Method):
    """One engine configuration (plain or speculative) in its own worker process."""

    def __init__(self, name: str, engine: str, params: dict, config_hash: str, model_dir: str, dtype: str,
                 eos_token_ids: Sequence[int] | None = None, threads: int = 1, command: Sequence[str] | None = None):
        peer = PEERS[engine]
        super().__init__(name, peer.drafter_label(params), engine, params, config_hash)
        self.engine, self.dtype = peer, dtype
        self.eos = sorted(eos_token_ids or [])
        self.speculative = self.drafter != "none"
        self.log = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 - the engine's output, kept open
                                                                   # for the worker's life, quoted on failure
        command = list(command or [str(peer.python(params)), str(peer.worker_path())])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env=peer.environment(params, threads))
        atexit.register(self.close)
        self._send({"model": model_dir, "dtype": dtype, "engine_args": peer.engine_args(params)})
        self.version: str | None = None

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _reply(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            last = next((ln for ln in reversed(self.log.read().splitlines()) if ln.strip()), "no output")
            raise ConfigError(f"method {self.name}: the {self.verifier} worker exited ({self.process.wait()}): {last}")
        reply = json.loads(line)
        if "error" in reply:
            raise ConfigError(f"method {self.name}: {self.verifier} failed: {reply['error']}")
        return reply

    def ready(self) -> None:
        """Wait for the engine to have loaded the model (once)."""
        if self.version is None:
            self.version = self._reply()["version"]

    def run(self, prompt_ids, max_new_tokens, seed, request_id=None):
        self.ready()
        self._send({"prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens, "eos": self.eos})
        reply = self._reply()
        return self._measurement(prompt_ids, list(reply["output_ids"]), float(reply["wall_s"]),
                                 reply.get("drafted"), reply.get("accepted"))

    def run_batch(self, prompts, max_new_tokens, seed, request_ids, batch_size):
        """The engine's own batching where it has one: every prompt of the batch in one call. Each
        request's ``wall_s`` is then the batch's (the engine reports no latency per request) and
        its draft counts are the batch's, so a speculative peer's tau and alpha stay null per request."""
        if batch_size == 1 or not self.engine.batches:
            return super().run_batch(prompts, max_new_tokens, seed, request_ids, batch_size)
        self.ready()
        self._send({"prompts": [list(p) for p in prompts], "max_new_tokens": max_new_tokens, "eos": self.eos})
        reply = self._reply()
        wall = float(reply["wall_s"])
        return [self._measurement(p, list(ids), wall, None, None)
                for p, ids in zip(prompts, reply["outputs"], strict=True)]

    def _measurement(self, prompt_ids, new: list[int], wall: float, drafted, accepted) -> Measurement:
        # greedy: each target forward commits one token of its own plus the accepted drafts
        forwards = len(new) - accepted if accepted is not None else None if self.speculative else len(new)
        fields = {
            "prompt_tokens": len(prompt_ids), "new_tokens": len(new), "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else 0.0, "target_forwards": forwards,
            "tau": len(new) / forwards if forwards else None, "alpha": accepted / drafted if drafted else None,
            "drafted": drafted, "accepted": accepted, "draft_s": None, "verify_s": None,
            "accept_per_position": None, "predicted_speedup": None,
        }
        return Measurement(new, fields)

    def close(self) -> None:
        """End the worker (its stdin closes: it leaves its loop)."""
        if self.process.poll() is None:
            if self.process.stdin:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def build_peer_method(spec: MethodSpec, target: Target, config_hash: str,
                      eos_token_ids: Sequence[int] | None = None) -> PeerMethod:
    """A peer spec's method on the target's own model (its directory, or for a GGUF engine its GGUF)
    and dtype, with this process's thread count; its worker starts loading now."""
    model = PEERS[spec.engine].model(spec.params, str(target.model.name_or_path), spec.name)
    method = PeerMethod(spec.name, spec.engine, spec.params, config_hash, model,
                        str(target.model.dtype).removeprefix("torch."), eos_token_ids, torch.get_num_threads())
    method.plain = spec.plain
    return method
