"""The Triton code Inductor generates for vLLM's native norm ops, at the shapes models use.

The reduction tree of that code (the block shape, warps, how the sum of squares is split) is what
an aligned training kernel must reproduce to equal vLLM's default path bit for bit
(docs/rounding.md, "arithmetic order"). Prints each generated module's source.
"""

import argparse

import torch
from torch._inductor.utils import run_and_get_code

from rla.engines import vllm

ap = argparse.ArgumentParser()
ap.add_argument("--wheel", required=True)
args = ap.parse_args()
engine = vllm.load(args.wheel)
for rows, n in ((4096, 1536), (4096, 2048), (4096, 3584), (4096, 4096), (65536, 128)):
    x = torch.randn(rows, n, device="cuda").bfloat16()
    r = torch.randn(rows, n, device="cuda").bfloat16()
    w = torch.randn(n, device="cuda").bfloat16()
    for name, fn, inputs in (("rms_norm", engine.rms_norm_native, (x, w, 1e-6)),
                             ("fused_add_rms_norm", engine.fused_add_rms_norm_native, (x, r, w, 1e-6))):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        _, code = run_and_get_code(compiled, *inputs)
        print(f"===== {name} [{rows}, {n}] =====")
        for c in code:
            print(c)
