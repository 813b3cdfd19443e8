"""Where the time of an op goes: host overhead per call and the CUDA kernels it launches.

1. Host overhead: 300 calls on tiny inputs (64 tokens), synchronised once at the end, so the GPU
   is never the bottleneck: microseconds per call of forward and forward+backward, for rla,
   Liger and HF eager. When this exceeds the kernel time, a per-op timing measures the host.
2. torch.profiler at the benchmark shapes: every CUDA kernel of rla's forward+backward.
3. --what timed-bwd: torch.profiler over the backward timing itself, rep by rep, per impl.
Usage (GPU): python lab/bench/profile_ops.py [--ops rope] [--impls rla liger] [--what timed-bwd]
"""

import torch
from host_time import per_call_us  # lab/bench/, beside this script

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

    return [per_call_us(f, n), per_call_us(fb, n)]


def profile_timed_bwd(case, impl, data, reps=5):
    """torch.profiler over the per-op benchmark's backward timing, rep by rep as ``time_ms`` runs
    it: forward untimed, L2 flush, start event, ``autograd.grad``, end event."""
    from rla.bench.common import time_reps_ms

    fn = case.impls[impl]
    consts = data.get("consts", ())
    prep = case.prepare.get(impl, lambda *xs: xs)
    grads = data["grad_outputs"]

    def setup():
        inputs = prep(*data["inputs"])
        return inputs, fn(*inputs, *consts)

    def bwd(state):
        inputs, outs = state
        torch.autograd.grad(outs, [t for t in inputs if t.requires_grad], grads[: len(outs)])

    time_reps_ms(bwd, setup, warmup=3, reps=0, device=dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ms = time_reps_ms(bwd, setup, warmup=0, reps=reps, device=dev)
    print(f"\n== {case.name} {impl}: backward as timed, x{reps}; event ms per rep: "
          + ", ".join(f"{m:.3f}" for m in ms))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", nargs="*", default=["swiglu", "add_rms_norm", "rope"])
    ap.add_argument("--impls", nargs="*", default=["hf", "liger", "rla"])
    ap.add_argument("--what", nargs="*", default=["host", "kernels"], choices=["host", "kernels", "timed-bwd"])
    a = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    if "host" in a.what:
        print("host time per call, tiny inputs (us): fwd / fwd+bwd")
        for make in (lambda: B.swiglu_case(64, 256), lambda: B.add_rms_norm_case(64, 256),
                     lambda: B.rope_case(1, 64, 4, 2, 64)):
            case = make()
            if case.name not in a.ops:
                continue
            data = case.make(dev)
            for impl in a.impls:
                if impl in case.impls:
                    f, fb = host_us(case, impl, data)
                    print(f"  {case.name:13s} {impl:6s} {f:7.1f} / {fb:7.1f}", flush=True)
    for make in B.default_cases(16384):
        case = make()
        if case.name not in a.ops:
            continue
        data = case.make(dev)
        if "kernels" in a.what:
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
        if "timed-bwd" in a.what:
            for impl in a.impls:
                if impl in case.impls:
                    profile_timed_bwd(case, impl, data)
        del data, case
        torch.cuda.empty_cache()
