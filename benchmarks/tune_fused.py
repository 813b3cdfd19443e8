"""Launch-parameter sweep of the fused kernels at Qwen2.5-7B shapes (16384 tokens).

Times the kernel launchers directly (no autograd), L2 flushed before each repetition, and prints
one line per configuration; the defaults in ``rla/ops/_triton_*.py`` are set from its output.
Usage (GPU): python benchmarks/tune_fused.py
"""

import torch

from rla.bench.common import copy_bandwidth_gbs, time_ms
from rla.ops import _triton_norm, _triton_rope, _triton_swiglu

dev = torch.device("cuda")
lp = torch.bfloat16
T = 16384
bw = copy_bandwidth_gbs(dev)
print(f"copy bandwidth {bw:.0f} GB/s")


def report(name, cfg, ms, nbytes):
    print(f"{name:14s} {cfg:28s} {ms:.4f} ms  {nbytes / ms / 1e6:6.0f} GB/s  x{ms / (nbytes / bw / 1e6):.3f} of floor", flush=True)


g = torch.randn(T, 18944, device=dev, dtype=lp)
u = torch.randn_like(g)
dy = torch.randn_like(g)
n = g.numel()
for block in (1024, 2048, 4096, 8192):
    for warps in (4, 8, 16):
        if block // (warps * 32) < 2:
            continue
        _triton_swiglu.BLOCK, _triton_swiglu.NUM_WARPS = block, warps
        report("swiglu fwd", f"BLOCK={block} warps={warps}", time_ms(lambda _: _triton_swiglu.forward(g, u, False)), 6 * n)
        report("swiglu bwd", f"BLOCK={block} warps={warps}", time_ms(lambda _: _triton_swiglu.backward(dy, g, u)), 10 * n)
del g, u, dy

q = torch.randn(4, 4096, 28, 128, device=dev, dtype=lp).transpose(1, 2)
k = torch.randn(4, 4096, 4, 128, device=dev, dtype=lp).transpose(1, 2)
cos = torch.randn(4, 4096, 128, device=dev)
sin = torch.randn_like(cos)
nb = 4 * (q.numel() + k.numel()) + 8 * cos.numel()
for warps in (1, 2, 4, 8):
    _triton_rope.NUM_WARPS = warps
    report("rope fwd", f"warps={warps}", time_ms(lambda _: _triton_rope.launch(q, k, cos, sin, True, False, False)), nb)
    report("rope bwd", f"warps={warps}", time_ms(lambda _: _triton_rope.launch(q, k, cos, sin, True, False, True)), nb)
del q, k, cos, sin

x = torch.randn(T, 3584, device=dev, dtype=lp)
r = torch.randn_like(x)
w = torch.randn(3584, device=dev, dtype=lp)
n = x.numel()
for warps in (4, 8, 16, 32):
    _triton_norm.FWD_WARPS = warps
    report("addnorm fwd", f"warps={warps}", time_ms(lambda _: _triton_norm.forward(x, r, w, 1e-6, False, True)), 8 * n)
_triton_norm.FWD_WARPS = None
_, _, rstd = _triton_norm.forward(x, r, w, 1e-6, False, True)
dy, dres = torch.randn_like(x), torch.randn_like(x)
for progs in (1, 2, 4, 8):
    for warps in (8, 16):
        _triton_norm.BWD_PROGRAMS_PER_SM, _triton_norm.BWD_WARPS = progs, warps
        report("addnorm bwd", f"progs/SM={progs} warps={warps}",
               time_ms(lambda _: _triton_norm.backward(dy, dres, x, r, w, rstd, True)), 10 * n)
