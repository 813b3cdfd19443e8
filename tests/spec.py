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


def _norm(v, w, eps, prof, lp):
    rstd = torch.rsqrt(torch.mean(v * v, dim=-1, keepdim=True) + eps)
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
    return _norm(v, w, eps, prof, lp), new_residual
