"""An RMSNorm whose mean square comes from another tensor: ``x * rsqrt(mean(s**2) + eps) * w``.

What it is for: a compiled graph that stores a value ``x = RN(s)`` (the next residual) and fuses
the following norm's sum of squares into the producer, so the reduction reads the fp32 ``s`` while
the normalisation reads the stored ``x`` (vLLM 0.33's compiled Gemma 4: the norm after a layer and
after the embedding, the ``stream_variance`` / ``embed_variance`` variant points,
``rla.profiles.variant_points``). With ``s = x`` it is ``reference.rms_norm`` bit for bit: the same
reduction (``norm_reduction``, the plain norm's or the add + norm kernel's order, ``after_add``),
the same weight product (``norm_weight``), the same rounding at the store.

This module is the PyTorch reference (the CPU path, and the oracle of the kernel). On CUDA
``rla.ops.rms_norm(..., variance_of=s)`` runs rla's Triton kernels (``rla.ops._triton_norm_var``
behind ``rla.ops.fused.rms_norm_variance_of``), built from the norm kernels' own reduction helpers
and launch shapes: under ``vllm_block`` the forward is this reference bit for bit (the tree's adds
are explicit, in this order); under ``unpinned`` the sum is Triton's tree, as the plain Triton
norm's is, so rstd may differ from this one's by an fp32 ulp in a few rows (the output by one lp
ulp, two under ``per_op``: the plain kernel's tolerance). With ``s = x`` the kernel is the plain
Triton norm bit for bit under either order. Its backward is the rule below: d_x elementwise (these
bits wherever rstd is), the mean and d_w summed in Triton's order.

Backward, for ``y = (v * r) * w`` with ``v = x.float()``, ``r = rsqrt(mean(s^2) + eps)``, ``n = v * r``
and ``g`` the output's gradient (roundings straight-through, as every rla op):

- ``d_x = r * (g * w)``: only the normalisation reads ``x``;
- ``d_s = -r * (s * r) * mean(g * w * n)``: only the mean square reads ``s`` (``dr/ds = -r^3 s / H``);
- ``d_w = sum over rows of g * n``.

A training step whose ``x`` is ``RN(s)`` (``s.to(lp)`` in its graph, whose derivative autograd takes as
the identity) gets ``d_x + d_s`` at ``s``: ``r * (g w - m * mean(g w n))`` with ``m = s * r``, the plain
norm's gradient except that the centring term's mean reads ``n = x * r`` where the plain norm's reads
``m``. It is the derivative of the function the forward computes, not of a norm of ``s`` alone: the two
differ by the rounding of ``x``, as the forwards do. Saved: ``x``, ``s``, the weight and ``r``.
"""

from __future__ import annotations

import torch

from rla.ops._rounding import _as
from rla.ops.reference import _engine_weight, _norm_fwd, _rstd
from rla.profiles import RoundingProfile

__all__ = ["rms_norm_variance_of"]


class _RMSNormVarianceOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s, weight, eps: float, per_op: bool, lp: torch.dtype, out_dtype: torch.dtype, tree: bool,
                after_add: bool):
        rstd = _rstd(s.float(), eps, tree, fused_add=after_add)
        ctx.save_for_backward(x, s, weight, rstd)
        ctx.lp = lp
        return _norm_fwd(x.float(), rstd, _engine_weight(weight, lp), lp, per_op, out_dtype)

    @staticmethod
    def backward(ctx, dy):
        x, s, weight, rstd = ctx.saved_tensors
        w = _engine_weight(weight, ctx.lp)
        n = x.float() * rstd
        gw = dy.float() * w
        dx = ds = dw = None
        if ctx.needs_input_grad[0]:
            dx = _as(rstd * gw, x.dtype)
        if ctx.needs_input_grad[1]:
            ds = _as(-rstd * (s.float() * rstd) * (gw * n).mean(-1, keepdim=True), s.dtype)
        if ctx.needs_input_grad[2]:
            dw = (dy.float() * n).reshape(-1, n.shape[-1]).sum(0).to(weight.dtype)
        return dx, ds, dw, None, None, None, None, None, None


def rms_norm_variance_of(x, s, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None,
                         out_dtype: torch.dtype | None = None, after_add: bool = False):
    """``x`` normalised by the mean square of ``s`` under ``profile``'s ``norm_weight`` and
    ``norm_reduction`` (inputs already validated: ``rla.ops.rms_norm(..., variance_of=s)``). ``dtype``:
    the stack's lp dtype (default ``x.dtype``); ``out_dtype`` fp32: the output unrounded."""
    lp = x.dtype if dtype is None else dtype
    return _RMSNormVarianceOf.apply(x, s, weight, float(eps), profile.norm_weight == "per_op", lp, out_dtype or lp,
                                    profile.norm_reduction == "vllm_block", bool(after_add))
