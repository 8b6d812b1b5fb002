"""The worker side of the peer protocol (`spec_zoo.bench.peers`), shared by every engine's worker
script. Standard library only: it runs in the engine's own venv, imported by bare name from the
worker's directory (a script's directory is first on its ``sys.path``), never as part of spec-zoo.

Protocol, one JSON object per line: the first line read is the setup (``model``, ``dtype``,
``engine_args``: the engine's own keyword arguments with its ``speculative_config``), answered
``{"ready": true, "version": ...}``. Then each request ``{"prompt_ids", "max_new_tokens", "eos"}``
is answered ``{"output_ids", "wall_s", "drafted", "accepted"}`` (greedy; ``wall_s`` times the
engine's generation alone; drafted / accepted over this request, null without speculation). A
worker of an engine that batches (`PeerEngine.batches`) also takes ``{"prompts": [ids, ...],
"max_new_tokens", "eos"}``, decodes them side by side and answers ``{"outputs": [ids, ...],
"wall_s", "drafted", "accepted"}`` (the batch's time and counts). Any
failure is answered ``{"error": "..."}``. The engine's own prints go to stderr: stdout carries the
protocol only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

#: an engine's worker: the setup -> (engine version, the function answering one request)
Start = Callable[[dict], "tuple[str, Callable[[dict], dict]]"]


def serve(start: Start) -> None:
    """Answer the setup line with ``start``, then every request line with what it returned."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # everything else printed (the engine's logs, C-level prints included) goes to stderr

    def answer(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")

    try:
        version, generate = start(json.loads(sys.stdin.readline()))
    except Exception as err:
        answer(_error(err))
        return
    answer({"ready": True, "version": version})
    for line in sys.stdin:
        try:
            answer(generate(json.loads(line)))
        except Exception as err:
            answer(_error(err))


def _error(err: Exception) -> dict:
    return {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
