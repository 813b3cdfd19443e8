"""The PyTorch reference of the three regions: docs/rounding.md written as code, one fp32 op at a time.

This file is the single source of truth for the numerics; the gated products (SwiGLU, GeGLU) are
one Function it shares with the attention gate (``_gated.py``), RN and the output cast are
``_rounding.py``'s. Every fast path (``fused.py``) and the model patch (``rla.align``) are tested
against it, bit for bit where the spec says so; the CPU path runs it directly.

How a rounding point becomes code: the inputs are upcast to fp32, each fp32 step is one PyTorch
op on fp32 tensors (no ``addcmul``: a fused multiply-add would skip a rounding the spec writes),
and ``RN`` is ``.to(lp).float()``, which rounds to nearest-even like every engine's store. On fp32
inputs ``lp`` is fp32 and ``RN`` is the identity: the same code runs and nothing is rounded.

Backward. The profile only moves roundings; the backward treats each rounding as the identity
(straight-through), computes every gradient in fp32 and rounds it once to its input's dtype. That
is at least as accurate as HF eager's backward, which rounds after every op. To keep no more
memory for backward than HF eager, the functions save only their inputs (and rstd, one fp32 per
row) and recompute the cheap fp32 intermediates: HF's RMSNorm keeps an fp32 copy of its input plus
a bf16 copy of the normalised value; its SwiGLU keeps silu(gate).
"""

from __future__ import annotations

import torch

from rla.ops._gated import gated_product
from rla.ops._rounding import _as, _rn
from rla.ops.reduction import block_sum_squares, call_tree
from rla.profiles import RoundingProfile

__all__ = ["rope", "swiglu", "geglu", "swiglu_oai", "rms_norm", "rms_norm_and_round", "add_rms_norm", "carry_add",
           "qk_norm_rope"]


def _rot(x: torch.Tensor) -> torch.Tensor:
    """HF's ``rotate_half``: cat(-x2, x1) on the halves of the last dim (exact)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rot_t(y: torch.Tensor) -> torch.Tensor:
    """Transpose of ``_rot``: cat(y2, -y1); the backward of the rotation."""
    y1, y2 = y.chunk(2, dim=-1)
    return torch.cat((y2, -y1), dim=-1)


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def _rope_tables(cos, sin, lp, round_cos_sin):
    c, s = cos.float(), sin.float()
    if round_cos_sin:
        c, s = _rn(c, lp), _rn(s, lp)
    return c, s


def _rope_fwd(x, c, s, per_op, lp):
    xf = x.float()
    if per_op:
        out = _rn(xf * c, lp) + _rn(_rot(xf) * s, lp)
    else:
        out = xf * c + _rot(xf) * s
    return _as(out, lp)


def _rope_bwd(g, c, s, dtype):
    gf = g.float()
    return _as(gf * c + _rot_t(gf * s), dtype)


def _full(c: torch.Tensor, half: bool) -> torch.Tensor:
    """A half table [..., D/2] as HF's full one, cat(c, c) (exact); a full table as it is."""
    return torch.cat((c, c), dim=-1) if half else c


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, round_cos_sin: bool, per_op: bool, lp: torch.dtype, half: bool = False):
        c, s = _rope_tables(_full(cos, half), _full(sin, half), lp, round_cos_sin)
        # the tables as handed in: one half table shared by every layer, not a full copy per layer
        ctx.save_for_backward(cos, sin)
        ctx.round_cos_sin, ctx.lp, ctx.half = round_cos_sin, lp, half
        ctx.dtypes = (q.dtype, k.dtype)
        return _rope_fwd(q, c, s, per_op, lp), _rope_fwd(k, c, s, per_op, lp)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        c, s = _rope_tables(_full(cos, ctx.half), _full(sin, ctx.half), ctx.lp, ctx.round_cos_sin)
        dq = _rope_bwd(gq, c, s, ctx.dtypes[0]) if gq is not None and ctx.needs_input_grad[0] else None
        dk = _rope_bwd(gk, c, s, ctx.dtypes[1]) if gk is not None and ctx.needs_input_grad[1] else None
        return dq, dk, None, None, None, None, None, None


def rope(q, k, cos, sin, profile: RoundingProfile, unsqueeze_dim: int = 1, dtype: torch.dtype | None = None):
    """Rotary embedding of ``q`` and ``k`` under ``profile`` (inputs already validated).

    ``cos``/``sin`` are [..., S, D] as HF's rotary module returns them, or [..., S, D/2], the
    first half of that table (HF builds it as ``cat(freqs, freqs)``), and are unsqueezed at
    ``unsqueeze_dim`` to broadcast against q [B, H, S, D] (or [B, S, H, D] with dim 2). A half
    table is kept for backward as it is (a view of the one table every layer shares) and made
    whole again in the forward and in the backward.

    ``dtype`` is the stack's low-precision dtype (default q's). An fp32 ``q``/``k`` with
    ``dtype=torch.bfloat16`` is the unrounded output of a q/k norm (``qk_norm_out='fp32'``): the
    rotation reads it as is and rounds once, at its output, to ``dtype``.
    """
    lp = q.dtype if dtype is None else dtype
    half = cos.shape[-1] != q.shape[-1]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return _Rope.apply(
        q, k, cos, sin, profile.rope_cos_sin == "round", profile.rope_apply == "per_op", lp, half
    )


# --------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------


def swiglu(gate, up, profile: RoundingProfile):
    """silu(gate) * up under ``profile`` (inputs already validated): ``rla.ops._gated``'s product."""
    return gated_product(gate, up, "silu", 0, profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# GeGLU (tanh approximation): Gemma's gated MLP
# --------------------------------------------------------------------------------------------


def geglu(gate, up, profile: RoundingProfile):
    """gelu_tanh(gate) * up under ``profile.swiglu`` (the gated product's point; inputs already
    validated): ``per_op`` = RN(RN(gelu(g)) * u), ``fused`` = RN(gelu(g) * u). gelu is PyTorch's
    tanh approximation in fp32 (``F.gelu(g.float(), approximate='tanh')``), which is what HF's
    ``gelu_pytorch_tanh`` computes inside its bf16 op before rounding."""
    return gated_product(gate, up, "gelu_tanh", 0, profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# GPT-OSS's clamped SwiGLU: (clamp(u, -l, l) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=l)
# --------------------------------------------------------------------------------------------


def _oai_parts(gf, uf, alpha, limit):
    g = gf.clamp(max=limit)
    u = uf.clamp(min=-limit, max=limit)
    return g, u


class _SwiGLUOAI(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, alpha: float, limit: float, order: str):
        lp = gate.dtype
        g, u = _oai_parts(gate.float(), up.float(), alpha, limit)
        if order == "per_op":  # HF's GptOssExperts._apply_gate on lp tensors: every op rounded
            t = _rn(g * alpha, lp)
            glu = _rn(g * _rn(torch.sigmoid(t), lp), lp)
            out = _rn(u + 1.0, lp) * glu
        elif order == "quotient":  # fp32, one division (vLLM's swigluoai_and_mul kernel), one rounding at the store
            out = (g * (u + 1.0)) / (1.0 + torch.exp(-(g * alpha)))
        else:  # fp32 as HF writes it, the sigmoid first, one rounding at the store
            out = (u + 1.0) * (g * torch.sigmoid(g * alpha))
        ctx.save_for_backward(gate, up)
        ctx.alpha, ctx.limit = alpha, limit
        return _as(out, lp)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        gf, uf, dyf = gate.float(), up.float(), dy.float()
        alpha, limit = ctx.alpha, ctx.limit
        g, u = _oai_parts(gf, uf, alpha, limit)
        sig = torch.sigmoid(g * alpha)
        dgate = dup = None
        if ctx.needs_input_grad[0]:  # clamp passes the gradient where the input is inside its bounds
            d = (u + 1.0) * (sig + g * alpha * sig * (1.0 - sig))
            dgate = (dyf * torch.where(gf <= limit, d, torch.zeros_like(d))).to(gate.dtype)
        if ctx.needs_input_grad[1]:
            inside = (uf >= -limit) & (uf <= limit)
            dup = (dyf * torch.where(inside, g * sig, torch.zeros_like(g))).to(up.dtype)
        return dgate, dup, None, None, None


def swiglu_oai(gate, up, alpha: float, limit: float, profile: RoundingProfile):
    """GPT-OSS's clamped SwiGLU under ``profile.swiglu`` (inputs already validated): ``per_op`` =
    HF's op sequence on lp tensors, RN(RN(RN(u) + 1) * RN(g * RN(sigmoid(RN(g * alpha))))) with the
    clamps exact; ``fused``, in fp32 rounded once, as ``profile.oai_glu`` orders it: ``sigmoid`` =
    RN((u + 1) * (g * sigmoid(g * alpha))), ``quotient`` = RN((g * (u + 1)) / (1 + exp(-(g * alpha))))."""
    order = "per_op" if profile.swiglu == "per_op" else profile.oai_glu
    return _SwiGLUOAI.apply(gate, up, float(alpha), float(limit), order)


# --------------------------------------------------------------------------------------------
# RMSNorm and residual-add + RMSNorm
# --------------------------------------------------------------------------------------------


def _engine_weight(weight: torch.Tensor, lp: torch.dtype, offset: float = 0.0) -> torch.Tensor:
    """The engine's copy of the weight, in fp32: RN(w) when an fp32 master weight meets ``lp``.
    ``offset`` (1.0 for a zero-centred norm) is added to that copy in fp32, as every stack forms
    Gemma's ``1 + w`` (HF ``1.0 + self.weight.float()``, vLLM ``self.weight.float() + 1.0``)."""
    if weight.dtype == torch.float32 and lp != torch.float32:
        w = weight.to(lp).float()
    else:
        w = weight.float()
    return w + offset if offset else w


def _rstd(v: torch.Tensor, eps: float, tree: bool = False, fused_add: bool = False) -> torch.Tensor:
    """rstd of fp32 rows ``v``. ``tree`` False (``norm_reduction='unpinned'``): the same ops in
    the same order as HF's Qwen2RMSNorm / LlamaRMSNorm, pow(2).mean(-1) + eps, rsqrt. True
    (``vllm_block``): the sum of squares in vLLM's kernel order, an IEEE division by n, + eps,
    rsqrt (``rla.ops.reduction``)."""
    if not tree:
        return torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    n = v.shape[-1]
    total = block_sum_squares(v, call_tree(v, fused_add)).unsqueeze(-1)
    # a tensor divisor: PyTorch's CUDA division by a Python scalar multiplies by its reciprocal
    return torch.rsqrt(total / torch.full_like(total, n) + eps)


def _norm_fwd(v, rstd, w, lp, per_op, out_dtype=None):
    n = v * rstd
    out = w * _rn(n, lp) if per_op else n * w
    return _as(out, out_dtype or lp)


def _norm_bwd(dy, v, rstd, w, need_w, w_dtype):
    """fp32 gradients of out = (v*rstd)*w w.r.t. v and w (roundings straight-through)."""
    n = v * rstd
    dyf = dy.float()
    dyw = dyf * w
    dv = rstd * (dyw - n * (dyw * n).mean(-1, keepdim=True))
    dw = (dyf * n).reshape(-1, n.shape[-1]).sum(0).to(w_dtype) if need_w else None
    return dv, dw


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float, per_op: bool, lp: torch.dtype, out_dtype: torch.dtype, tree: bool,
                after_add: bool, offset: float = 0.0):
        v = x.float()
        rstd = _rstd(v, eps, tree, fused_add=after_add)
        ctx.save_for_backward(x, weight, rstd)
        ctx.lp, ctx.offset = lp, offset
        return _norm_fwd(v, rstd, _engine_weight(weight, lp, offset), lp, per_op, out_dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        w = _engine_weight(weight, ctx.lp, ctx.offset)  # d(offset + w)/dw = 1: dw is the same sum
        dv, dw = _norm_bwd(dy, x.float(), rstd, w, ctx.needs_input_grad[1], weight.dtype)
        dx = dv.to(x.dtype) if ctx.needs_input_grad[0] else None
        return dx, dw, None, None, None, None, None, None, None


class _RMSNormAndRound(torch.autograd.Function):
    """(RMSNorm(x), RN(x)): ``_RMSNorm``'s forward plus the rounded copy of x, and one backward
    for both outputs, d_x = d_norm + d_rounded in fp32, then rounded once to x's dtype."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, per_op: bool, lp: torch.dtype, tree: bool, after_add: bool,
                offset: float = 0.0):
        ctx.set_materialize_grads(False)
        v = x.float()
        rstd = _rstd(v, eps, tree, fused_add=after_add)
        ctx.save_for_backward(x, weight, rstd)
        ctx.lp, ctx.offset = lp, offset
        normed = _norm_fwd(v, rstd, _engine_weight(weight, lp, offset), lp, per_op)
        return normed, x.to(lp, copy=True)

    @staticmethod
    def backward(ctx, dy, drounded):
        x, weight, rstd = ctx.saved_tensors
        w = _engine_weight(weight, ctx.lp, ctx.offset)
        if dy is not None:
            dv, dw = _norm_bwd(dy, x.float(), rstd, w, ctx.needs_input_grad[1], weight.dtype)
        else:
            dv, dw = torch.zeros_like(x, dtype=torch.float32), None
        if drounded is not None:
            dv = dv + drounded.float()
        dx = dv.to(x.dtype) if ctx.needs_input_grad[0] else None
        return dx, dw, None, None, None, None, None, None


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, per_op: bool, fp32_sum: bool, tree: bool, offset: float = 0.0,
                source=None, with_residual: bool = True):
        lp = x.dtype
        ctx.offset = offset
        total = x.float() + residual.float()
        # fp32_sum without the residual handed on: RN(x + r) is not formed at all
        new_residual = total.to(lp) if with_residual or not fp32_sum else None
        v = total if fp32_sum else new_residual.float()
        rstd = _rstd(v, eps, tree, fused_add=True)
        # fp32_sum needs x and r to rebuild the fp32 sum (r as RN(source) when the fp32 tensor r was
        # rounded from is given: one the next norm keeps anyway); rounded_sum only the rounded sum,
        # which is the output handed on as the next residual anyway.
        ctx.of_source = fp32_sum and source is not None
        if fp32_sum:
            ctx.save_for_backward(x, source if ctx.of_source else residual, weight, rstd)
        else:
            ctx.save_for_backward(new_residual, weight, rstd)
        ctx.fp32_sum = fp32_sum
        ctx.dtypes = (x.dtype, residual.dtype)
        normed = _norm_fwd(v, rstd, _engine_weight(weight, lp, offset), lp, per_op)
        return (normed, new_residual) if with_residual else normed

    @staticmethod
    def backward(ctx, dnormed, dresidual=None):
        x_dtype, r_dtype = ctx.dtypes
        if ctx.fp32_sum:
            x, residual, weight, rstd = ctx.saved_tensors
            if ctx.of_source:  # RN(source) is the residual, bit for bit
                residual = residual.to(r_dtype)
            v = x.float() + residual.float()
        else:
            new_residual, weight, rstd = ctx.saved_tensors
            v = new_residual.float()
        w = _engine_weight(weight, x_dtype, ctx.offset)
        if dnormed is not None:
            dv, dw = _norm_bwd(dnormed, v, rstd, w, ctx.needs_input_grad[2], weight.dtype)
        else:
            dv, dw = torch.zeros_like(v), None
        if dresidual is not None:
            dv = dv + dresidual.float()
        dx = dv.to(x_dtype) if ctx.needs_input_grad[0] else None
        dr = dv.to(r_dtype) if ctx.needs_input_grad[1] else None
        return dx, dr, dw, None, None, None, None, None, None, None


def rms_norm(
    x, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None, after_add: bool = False, weight_offset: float = 0.0,
):
    """RMSNorm of ``x`` under ``profile``'s ``norm_weight`` and ``norm_reduction`` points (inputs
    already validated; ``after_add``: see ``rla.ops.rms_norm``).

    ``dtype`` is the stack's low-precision dtype (default ``x.dtype``). An fp32 ``x`` with
    ``dtype=torch.bfloat16`` is an fp32 residual sum that the norm reads (``fp32_sum``): the norm
    is computed from it and rounded once to bf16. ``out_dtype=torch.float32`` skips that last
    rounding: the unrounded output of a q/k norm that RoPE reads (``qk_norm_out='fp32'``); the
    weight is still the engine's ``lp`` copy and a ``per_op`` product still rounds x*rstd.
    ``weight_offset`` (1.0: a zero-centred norm, ``x * rstd * (1 + w)``) is added in fp32 to the
    engine's copy of the weight before the product.
    """
    lp = x.dtype if dtype is None else dtype
    return _RMSNorm.apply(
        x, weight, float(eps), profile.norm_weight == "per_op", lp, out_dtype or lp,
        profile.norm_reduction == "vllm_block", after_add, float(weight_offset),
    )


def rms_norm_and_round(
    x, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None, after_add: bool = False,
    weight_offset: float = 0.0,
):
    """(rms_norm(x, ..., dtype), x.to(dtype)) as one op (inputs already validated): the norm's
    numbers exactly as :func:`rms_norm` computes them, and RN(x) in the stack dtype. Backward:
    d_x = RN_x(d_norm + d_rounded), the two summed in fp32; for an fp32 x (a residual sum read by
    a decoder layer's input norm) that is the fp32 add autograd does for the two separate ops,
    bit for bit (fp32 addition is commutative, and nothing rounds before or after it). Saved: x,
    the weight and rstd, what :func:`rms_norm` keeps; RN(x) is not kept."""
    lp = x.dtype if dtype is None else dtype
    return _RMSNormAndRound.apply(
        x, weight, float(eps), profile.norm_weight == "per_op", lp, profile.norm_reduction == "vllm_block",
        after_add, float(weight_offset),
    )


def add_rms_norm(x, residual, weight, eps: float, profile: RoundingProfile, weight_offset: float = 0.0,
                 residual_source=None, new_residual: bool = True):
    """(norm(x + residual), RN(x + residual)) under ``profile`` (inputs already validated); the
    norm's reduction is the add + norm kernel's (``after_add``); ``weight_offset`` as for
    :func:`rms_norm`. ``residual_source``: the fp32 tensor ``residual`` was rounded from; under
    ``fp32_sum`` it is kept for backward instead of ``residual`` (the same numbers).
    ``new_residual`` False: ``normed`` alone (under ``fp32_sum`` RN(x + r) is not formed)."""
    fp32_sum = profile.norm_residual == "fp32_sum"
    return _AddRMSNorm.apply(
        x,
        residual,
        weight,
        float(eps),
        profile.norm_weight == "per_op",
        fp32_sum,
        profile.norm_reduction == "vllm_block",
        float(weight_offset),
        residual_source if fp32_sum else None,
        bool(new_residual),
    )


# --------------------------------------------------------------------------------------------
# The fp32_carry residual add
# --------------------------------------------------------------------------------------------


class _CarryAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, m, out_dtype: torch.dtype):
        ctx.dtypes = (x.dtype, residual.dtype, m.dtype)
        s = (x.float() + residual.float()) + m.float()
        return _as(s, out_dtype)

    @staticmethod
    def backward(ctx, g):
        cast = {}  # one cast per distinct dtype, the same tensor handed to each input of that dtype
        for d in ctx.dtypes:
            if d not in cast:
                cast[d] = g.to(d)
        return tuple(cast[d] for d in ctx.dtypes) + (None,)


def carry_add(x, residual, m, out_dtype: torch.dtype):
    """(x + residual) + m in fp32, rounded once to ``out_dtype`` (``residual_stream='fp32_carry'``:
    the MLP's add reads the attention's unrounded sum x + residual)."""
    return _CarryAdd.apply(x, residual, m, out_dtype)


# --------------------------------------------------------------------------------------------
# The q/k norm -> RoPE chain (qk_norm_out='fp32')
# --------------------------------------------------------------------------------------------


def _token_major(x: torch.Tensor, head_axis: int | None) -> torch.Tensor:
    """``x`` as the [B, S, H, D] view HF's q/k norm reads (before its ``transpose(1, 2)``)."""
    return x.transpose(1, 2) if head_axis == 1 else x


def qk_norm_rope(
    q, k, q_weight, k_weight, eps, cos, sin, profile: RoundingProfile, unsqueeze_dim: int = 1,
    dtype: torch.dtype | None = None,
):
    """RoPE of RMSNorm(q), RMSNorm(k) with the norms' output unrounded (``qk_norm_out='fp32'``),
    rounded once to ``dtype`` at RoPE's output (inputs already validated; ``eps`` a float or a
    (q_eps, k_eps) pair). The composition of :func:`rms_norm` (``out_dtype=torch.float32``) and
    :func:`rope`, op for op: the CPU path, and the oracle of the fused kernel."""
    return compose_qk_norm_rope(rms_norm, rope, q, k, q_weight, k_weight, eps, cos, sin, profile, unsqueeze_dim, dtype)


def compose_qk_norm_rope(rms_norm_fn, rope_fn, q, k, q_weight, k_weight, eps, cos, sin, profile, unsqueeze_dim=1,
                         dtype=None):
    """The two-op chain with the given ``rms_norm`` and ``rope`` implementations. A 4-D q/k with
    ``unsqueeze_dim=1`` ([B, H, S, D], HF's transposed view) is normalised as the [B, S, H, D]
    view HF's q/k norm reads, so every op sees the tensors it sees in HF's attention."""
    lp = q.dtype if dtype is None else dtype
    q_eps, k_eps = (eps, eps) if isinstance(eps, (int, float)) else eps
    axis = 1 if q.ndim == 4 and unsqueeze_dim in (1, -3) else None

    def norm(x, w, e):
        y = rms_norm_fn(_token_major(x, axis), w, e, profile, lp, torch.float32)
        return _token_major(y, axis)

    return rope_fn(norm(q, q_weight, q_eps), norm(k, k_weight, k_eps), cos, sin, profile, unsqueeze_dim, lp)
