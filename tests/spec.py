"""An independent expression of docs/rounding.md, written for the tests.

It shares no code with ``rla.ops``: per-op roundings are expressed the way eager PyTorch does them
(arithmetic on low-precision tensors rounds every result), fused ones as fp32 arithmetic with one
explicit ``.to(dtype)`` at the end. If the two ever disagree, one of them misreads the spec.
"""

import torch
import torch.nn.functional as F

f32 = torch.float32


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def engine_weight(w, lp):
    return w.to(lp) if w.dtype == f32 else w


def rope(x, cos, sin, prof, unsqueeze_dim=1):
    lp = x.dtype
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if prof.rope_cos_sin == "round":
        c, s = cos.to(lp), sin.to(lp)
    else:
        c, s = cos, sin
    if prof.rope_apply == "per_op":
        if c.dtype == lp:  # eager arithmetic on lp tensors: every product and the sum rounded
            return x * c + rotate_half(x) * s
        return ((x.to(f32) * c).to(lp).to(f32) + (rotate_half(x).to(f32) * s).to(lp).to(f32)).to(lp)
    xf = x.to(f32)
    return (xf * c.to(f32) + rotate_half(xf) * s.to(f32)).to(lp)


def swiglu(g, u, prof):
    lp = g.dtype
    a = F.silu(g.to(f32))
    if prof.swiglu == "per_op":
        return a.to(lp) * u
    return (a * u.to(f32)).to(lp)


def vllm_mean_square(v: torch.Tensor, call_rows: int, after_add: bool) -> torch.Tensor:
    """sum(v*v)/n of fp32 rows ``v`` [m, n] in vLLM's CUDA kernel order (docs/rounding.md,
    "Reduction order"), written as the kernel runs it: scalar float32 arithmetic, one thread's
    partial at a time, then cub's warp shuffles (lane i adds lane i+offset while that lane is in
    the block, offsets 1..16) and the warps' sums in order. ``call_rows``: the rows of the call,
    which pick the block size. Slow; for small rows and for checking rla.ops.reduction."""
    import math

    import numpy as np

    f = np.float32
    rows = v.detach().reshape(-1, v.shape[-1]).cpu().numpy()  # the oracle runs on the host
    n = rows.shape[1]
    most = 1024 if call_rows < 256 else 256
    if after_add:  # fused_add_rms_norm: 16-byte vectors of pair sums, or single elements
        vec = 8 if n % 8 == 0 else 1
        threads = min(n, most)
    else:  # rms_norm: vectors of gcd(8, n) elements, each square into the partial
        vec = math.gcd(8, n)
        threads = min(n // vec, most)
    out = []
    for row in rows:
        partial = [f(0.0)] * threads
        for t in range(threads):
            for i in range(t, n // vec, threads):
                chunk = row[i * vec:(i + 1) * vec]
                if after_add and vec == 8:
                    s = f(0.0)
                    for j in range(0, 8, 2):
                        s = f(s + f(f(chunk[j] * chunk[j]) + f(chunk[j + 1] * chunk[j + 1])))
                    partial[t] = f(partial[t] + s)
                else:
                    for x in chunk:
                        partial[t] = f(partial[t] + f(x * x))
        total = None
        for first in range(0, threads, 32):
            lanes = list(partial[first:first + 32])
            last = len(lanes) - 1
            offset = 1
            while offset < 32:
                lanes = [f(lanes[i] + lanes[i + offset]) if i + offset <= last else lanes[i] for i in range(len(lanes))]
                offset *= 2
            total = lanes[0] if total is None else f(total + lanes[0])
        out.append(f(total / f(n)))
    return torch.from_numpy(np.array(out, dtype=np.float32)).reshape(v.shape[:-1] + (1,)).to(v.device)


def _norm(v, w, eps, prof, lp, after_add=False):
    if prof.norm_reduction == "vllm_block":
        mean_square = vllm_mean_square(v, v.numel() // v.shape[-1], after_add)
    else:
        mean_square = torch.mean(v * v, dim=-1, keepdim=True)
    rstd = torch.rsqrt(mean_square + eps)
    w = engine_weight(w, lp)
    if prof.norm_weight == "per_op":
        return w * (v * rstd).to(lp)
    return ((v * rstd) * w.to(f32)).to(lp)


def rms_norm(x, w, eps, prof):
    return _norm(x.to(f32), w, eps, prof, x.dtype)


def add_rms_norm(x, r, w, eps, prof):
    lp = x.dtype
    new_residual = x + r  # eager lp add: RN(x + r)
    v = x.to(f32) + r.to(f32) if prof.norm_residual == "fp32_sum" else new_residual.to(f32)
    return _norm(v, w, eps, prof, lp, after_add=True), new_residual
