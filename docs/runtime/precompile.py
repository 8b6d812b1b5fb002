# ruff: noqa: E402 (a measurement script: the thread count is set before the models load)
"""torch's precompile API on the compiled runtime's graph: compile in one process, load in another.

python precompile.py save FREEZING GEMM_BACKENDS   (e.g. `save 0 ATEN`; `save 1 CPP` is the default runtime)
python precompile.py load FREEZING GEMM_BACKENDS   (a second process: load the saved graph, decode 12 tokens)

On the tiny sampling model. `aot_compile` + `save_compiled_function` (torch 2.13, experimental)
serialise dynamo's transformed bytecode and inductor's output, so a second process skips
dynamo's trace, AOTAutograd and the freezing passes that a cache hit still runs."""
import sys
import time

import torch

torch.set_num_threads(1)
from spec_zoo import SpeculativeDecoder
from spec_zoo.runtime import CompiledTarget
from spec_zoo.testing import hf_greedy, sampling_model

mode, freezing, backends = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
path = "/tmp/spec_zoo_precompiled_rows.bin"
model = sampling_model().float()
target = CompiledTarget(model, max_cache_len=96, buckets=(2, 4), key_block=16, freezing=freezing,
                        gemm_backends=backends)
size, span, width = 2, 32, 48
inputs = target._dynamic(torch.zeros(size, dtype=torch.long), torch.full((size,), 0), torch.zeros(1, 1, 1, span),
                         torch.zeros(size, width, dtype=torch.long), torch.zeros(size, width))
start = time.time()
if mode == "save":
    compiled = torch.compile(target._rows, fullgraph=True)
    with torch.no_grad():
        aot = target._with_rowwise_attention(lambda *a: compiled.aot_compile((a, {})))(*inputs)
    aot.save_compiled_function(path)
else:
    from torch.compiler import load_compiled_function

    with open(path, "rb") as f:
        aot = load_compiled_function(f)
print(f"{mode}: {time.time() - start:.1f} s", flush=True)
aot.disable_guard_check()  # its guard on dynamic-dimension markings fails in a new process
target._compiled = target._with_rowwise_attention(lambda *a: aot(target, *a))  # the graph takes `self` first
prompt = [1, 2, 3, 4, 5]
out = SpeculativeDecoder(target).generate(prompt, max_new_tokens=12, eos_token_ids=[]).ids
print("equal to transformers' generate:", out == hf_greedy(model, prompt, 12))
