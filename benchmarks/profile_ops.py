"""Where the time of an op goes: host overhead per call and the CUDA kernels it launches.

1. Host overhead: 300 calls on tiny inputs (64 tokens), synchronised once at the end, so the GPU
   is never the bottleneck: microseconds per call of forward and forward+backward, for rla,
   Liger and HF eager. When this exceeds the kernel time, a per-op timing measures the host.
2. torch.profiler at the benchmark shapes: every CUDA kernel of rla's forward+backward.
Usage (GPU): python benchmarks/profile_ops.py
"""

import time

import torch

from rla.bench import ops as B

dev = torch.device("cuda")


def host_us(case, impl, data, n=300):
    fn = case.impls[impl]
    consts = data.get("consts", ())
    prep = case.prepare.get(impl, lambda *xs: xs)
    grads = data["grad_outputs"]
    inputs = prep(*data["inputs"])

    def f():
        return fn(*inputs, *consts)

    def fb():
        outs = f()
        torch.autograd.grad(outs, [t for t in inputs if t.requires_grad], grads[: len(outs)])

    res = []
    for g in (f, fb):
        for _ in range(20):
            g()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            g()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t) / n * 1e6)
    return res


print("host time per call, tiny inputs (us): fwd / fwd+bwd")
for make in (lambda: B.swiglu_case(64, 256), lambda: B.add_rms_norm_case(64, 256), lambda: B.rope_case(1, 64, 4, 2, 64)):
    case = make()
    data = case.make(dev)
    for impl in ("hf", "liger", "rla"):
        if impl in case.impls:
            a, b = host_us(case, impl, data)
            print(f"  {case.name:13s} {impl:6s} {a:7.1f} / {b:7.1f}", flush=True)

from torch.profiler import ProfilerActivity, profile  # noqa: E402

for make in B.default_cases(16384):
    case = make()
    data = case.make(dev)
    fn = case.impls["rla"]
    inputs, consts, grads = data["inputs"], data.get("consts", ()), data["grad_outputs"]
    for _ in range(3):
        outs = fn(*inputs, *consts)
        torch.autograd.grad(outs, list(inputs), grads[: len(outs)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            outs = fn(*inputs, *consts)
            torch.autograd.grad(outs, list(inputs), grads[: len(outs)])
        torch.cuda.synchronize()
    print(f"\n== {case.name}: rla fwd+bwd x5")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    del data, case
    torch.cuda.empty_cache()
