"""The quantized kernels against float32 on SmolLM2's shapes: every linear layer of the 30 blocks once
(weights streamed from memory, as a decode step reads them) and the 49,152-row output layer, M = 1, 2, 4, 8
rows, best of 7; one thread. Random weights (the kernels' speed does not depend on the values).

    OMP_NUM_THREADS=1 python docs/quantized/kernel_bench.py
"""

import time

import torch

from spec_zoo.runtime import quant_gemm

torch.set_num_threads(1)
print("kernel ISA:", quant_gemm.load())
torch.manual_seed(0)
BLOCK = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # q k v o gate up down
LINEARS, HEAD = BLOCK * 30, [(49152, 576)]


def quantized(shapes, bits):
    return [quant_gemm.quantize(torch.randn(n, k), bits)[:3] for n, k in shapes]


def best(run, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


layers = {4: quantized(LINEARS, 4)}
heads = {4: quantized(HEAD, 4), 8: quantized(HEAD, 8)}
dense, dense_head = [torch.randn(n, k) for n, k in LINEARS], torch.randn(*HEAD[0])
ops = {"float32 sums": torch.ops.spec_zoo.quant_linear, "int8 activations": torch.ops.spec_zoo.quant_linear_q8}
print("| M | float32 weights (aten), all linears + head | " + " | ".join(
    f"int4 linears, {name} | int8 head, {name} | int4 head, {name}" for name in ops) + " |")
for m in (1, 2, 4, 8):
    x = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}
    row = [best(lambda x=x: [torch.nn.functional.linear(x[w.shape[1]], w) for w in dense + [dense_head]], 5)]
    for op in ops.values():
        for bits, stack in ((4, layers[4]), (8, heads[8]), (4, heads[4])):
            if op is torch.ops.spec_zoo.quant_linear:  # its codes in the order it reads them here, as QuantLinear keeps
                stack = [(quant_gemm.kernel_codes(c, bits), s, lo) for c, s, lo in stack]
            row.append(best(lambda x=x, op=op, bits=bits, stack=stack: [op(x[s.shape[1] * 32], c, s, lo, bits)
                                                                     for c, s, lo in stack]))
    print(f"| {m} | " + " | ".join(f"{t:.2f} ms" for t in row) + " |")
