"""The fused GPU path of the three regions: Triton kernels behind ``torch.library`` custom ops.

Same functions and the same numbers as ``rla.ops.reference`` (bit for bit for RoPE and SwiGLU; for
the norms the row sum is reduced in another order, so rstd may differ by one fp32 ulp: on the H200
>= 99.998 % of outputs are equal, the rest one lp ulp apart, two under ``norm_weight="per_op"``
where the rounded intermediate is then scaled by the weight), at
the memory-bandwidth floor: each region reads its inputs once and writes its outputs once, in one
kernel, forward and backward. ``rla.ops`` sends CUDA tensors here when :func:`available` says so;
the reference stays the CPU path and the oracle the GPU tests compare against.

Why Triton and not an Inductor-compiled reference: Inductor reaches the bandwidth floor too, but it
contracts ``a*b + c`` into FMAs and uses its own ``exp`` (so its outputs are not the spec's
one-op-at-a-time numbers), it recompiles per shape family, and it cannot run inside a model that
is not itself compiled. The kernels here are compiled with contraction off and call libdevice's
``expf``/``div.rn``/``rsqrtf``, the functions PyTorch's own CUDA kernels use (``_triton_common``).

Two doors to the same launchers. Under ``torch.compile`` each op is a ``torch.library.custom_op``
with ``register_fake`` (shapes for FakeTensor tracing) and ``register_autograd`` (backward =
another custom op), checked with ``torch.library.opcheck``: the compiled graph holds them as opaque
nodes with symbolic shapes (no recompile when the sequence length changes, after the first
dynamic recompile). In eager mode the same launchers run through a plain
``torch.autograd.Function``: the custom-op dispatcher costs tens of microseconds of host time
per call, which is longer than the RoPE kernel itself (measured on the H200). CUDA graphs
capture either. Saved for backward: the inputs (the rounded sum instead of x and r for the
``rounded_sum`` add+norm) and one fp32 rstd per norm row; everything else is recomputed. The
q/k norm -> RoPE chain (``qk_norm_rope``) is one kernel each way whose row math is the norm
kernels' own helpers, so it equals the chain of ``rms_norm(out_dtype=fp32)`` and ``rope`` bit for
bit; it keeps q, k and one rstd per (token, head) row, and no fp32 q/k at all.

``triton`` is imported only when a kernel first runs, so importing this module on a machine
without Triton or CUDA costs nothing. ``RLA_FUSED=0`` in the environment turns the path off.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch
from torch import Tensor

from rla.ops import reference
from rla.ops._layout import output_like, token_major
from rla.profiles import RoundingProfile

__all__ = ["available", "rope", "swiglu", "rms_norm", "add_rms_norm", "carry_add", "qk_norm_rope"]

_HAS_TRITON = importlib.util.find_spec("triton") is not None
_ENABLED = os.environ.get("RLA_FUSED", "1") != "0"


def available(*tensors: Tensor) -> bool:
    """True when the fused kernels can run on these tensors: all on CUDA and Triton installed.

    Written in what Dynamo traces on every supported torch (``bool(tuple)`` is a graph break under
    torch 2.11: one per op call, which made a compiled aligned step slower than an eager one)."""
    return _ENABLED and _HAS_TRITON and len(tensors) > 0 and all([t.is_cuda for t in tensors])


def _compiling() -> bool:
    return torch.compiler.is_compiling()


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def _rope_launch(q, k, cos, sin, round_cos_sin, per_op, backward, head_axis, out_dtype=None):
    from rla.ops import _triton_rope

    return _triton_rope.launch(q, k, cos, sin, round_cos_sin, per_op, backward, head_axis, out_dtype)


@torch.library.custom_op("rla::rope", mutates_args=())
def _rope_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, round_cos_sin: bool, per_op: bool, head_axis: int,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    return _rope_launch(q, k, cos, sin, round_cos_sin, per_op, False, head_axis, out_dtype)


@_rope_op.register_fake
def _(q, k, cos, sin, round_cos_sin, per_op, head_axis, out_dtype):
    return output_like(q, out_dtype), output_like(k, out_dtype)


@torch.library.custom_op("rla::rope_backward", mutates_args=())
def _rope_bwd_op(
    gq: Tensor, gk: Tensor, cos: Tensor, sin: Tensor, round_cos_sin: bool, head_axis: int, out_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    return _rope_launch(gq, gk, cos, sin, round_cos_sin, False, True, head_axis, out_dtype)


@_rope_bwd_op.register_fake
def _(gq, gk, cos, sin, round_cos_sin, head_axis, out_dtype):
    return output_like(gq, out_dtype), output_like(gk, out_dtype)


def _rope_setup(ctx, inputs, output):
    q, _, cos, sin, round_cos_sin, _, head_axis, _ = inputs
    ctx.save_for_backward(cos, sin)
    ctx.flags = (round_cos_sin, head_axis, q.dtype)


def _rope_backward(ctx, gq, gk):
    cos, sin = ctx.saved_tensors
    dq, dk = _rope_bwd_op(gq, gk, cos, sin, *ctx.flags)
    return dq, dk, None, None, None, None, None, None


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, round_cos_sin: bool, per_op: bool, head_axis: int, out_dtype: torch.dtype):
        ctx.save_for_backward(cos, sin)
        ctx.flags = (round_cos_sin, head_axis, q.dtype)
        return _rope_launch(q, k, cos, sin, round_cos_sin, per_op, False, head_axis, out_dtype)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        round_cos_sin, head_axis, in_dtype = ctx.flags
        dq, dk = _rope_launch(gq, gk, cos, sin, round_cos_sin, False, True, head_axis, in_dtype)
        return dq, dk, None, None, None, None, None, None


def _rope_head_axis(q: Tensor, k: Tensor, cos: Tensor, unsqueeze_dim: int) -> Optional[int]:
    """Head axis of 4-D q/k (1 for [B, H, S, D], 2 for [B, S, H, D]) when the kernel's layout
    applies: cos/sin [B or 1, S or 1, D] unsqueezed at that axis; else None (reference path)."""
    if q.ndim != 4 or cos.ndim != 3:
        return None
    axis = unsqueeze_dim if unsqueeze_dim >= 0 else unsqueeze_dim + 4
    if axis not in (1, 2):
        return None
    seq_axis = 3 - axis
    B, S = q.shape[0], q.shape[seq_axis]
    if k.shape[0] != B or k.shape[seq_axis] != S:
        return None
    if cos.shape[0] not in (1, B) or cos.shape[1] not in (1, S):
        return None
    return axis


def rope(q, k, cos, sin, profile: RoundingProfile, unsqueeze_dim: int = 1, dtype=None):
    """Fused RoPE of q and k (one launch); see ``rla.ops.rope``. An fp32 q/k with ``dtype`` the
    stack's (the ``qk_norm_out='fp32'`` chain) is read in fp32 and rounded once at the store.
    Layouts the kernel does not cover (not 4-D, cos/sin broadcasting over heads in another way)
    run the reference."""
    axis = _rope_head_axis(q, k, cos, unsqueeze_dim)
    if axis is None:
        return reference.rope(q, k, cos, sin, profile, unsqueeze_dim, dtype)
    flags = (profile.rope_cos_sin == "round", profile.rope_apply == "per_op", axis, dtype or q.dtype)
    return (_rope_op if _compiling() else _RopeFn.apply)(q, k, cos, sin, *flags)


# --------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("rla::swiglu", mutates_args=())
def _swiglu_op(gate: Tensor, up: Tensor, per_op: bool) -> Tensor:
    from rla.ops import _triton_swiglu

    return _triton_swiglu.forward(gate, up, per_op)


@_swiglu_op.register_fake
def _(gate, up, per_op):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("rla::swiglu_backward", mutates_args=())
def _swiglu_bwd_op(dy: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    from rla.ops import _triton_swiglu

    return _triton_swiglu.backward(dy, gate, up)


@_swiglu_bwd_op.register_fake
def _(dy, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _swiglu_setup(ctx, inputs, output):
    gate, up, _ = inputs
    ctx.save_for_backward(gate, up)


def _swiglu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = _swiglu_bwd_op(dy, gate, up)
    return dgate, dup, None


_swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, per_op: bool):
        from rla.ops import _triton_swiglu

        ctx.save_for_backward(gate, up)
        return _triton_swiglu.forward(gate, up, per_op)

    @staticmethod
    def backward(ctx, dy):
        from rla.ops import _triton_swiglu

        gate, up = ctx.saved_tensors
        dgate, dup = _triton_swiglu.backward(dy, gate, up)
        return dgate, dup, None


def swiglu(gate, up, profile: RoundingProfile):
    """Fused silu(gate) * up; see ``rla.ops.swiglu``."""
    return (_swiglu_op if _compiling() else _SwiGLUFn.apply)(gate, up, profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# RMSNorm and residual-add + RMSNorm
# --------------------------------------------------------------------------------------------


def _norm_fwd(x, residual, weight, eps, per_op, fp32_sum, lp=None, out_dtype=None, reduction="unpinned", after_add=False):
    """The forward launcher of ``reduction``'s order: Triton's own tree, or vLLM's block
    reduction (``rla.ops.reduction``) for a norm after a residual add (``residual`` given, or
    ``after_add``: the sum was formed by the previous layer) or a plain one."""
    if reduction == "vllm_block":
        from rla.ops import _triton_norm_tree
        from rla.ops.reduction import call_tree

        tree = call_tree(x, fused_add=residual is not None or after_add)
        return _triton_norm_tree.forward(x, residual, weight.contiguous(), eps, per_op, fp32_sum, tree, lp, out_dtype)
    from rla.ops import _triton_norm

    return _triton_norm.forward(x, residual, weight.contiguous(), eps, per_op, fp32_sum, lp, out_dtype)


def _norm_bwd(dy, dresidual, a, b, weight, rstd, need_dw, lp=None):
    from rla.ops import _triton_norm

    return _triton_norm.backward(dy, dresidual, a, b, weight.contiguous(), rstd, need_dw, lp)


@torch.library.custom_op("rla::rms_norm", mutates_args=())
def _rms_norm_op(
    x: Tensor, weight: Tensor, eps: float, per_op: bool, lp: torch.dtype, out_dtype: torch.dtype,
    reduction: str, after_add: bool,
) -> tuple[Tensor, Tensor]:
    y, _, rstd = _norm_fwd(x, None, weight, eps, per_op, False, lp, out_dtype, reduction, after_add)
    return y, rstd


@_rms_norm_op.register_fake
def _(x, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("rla::add_rms_norm", mutates_args=())
def _add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, per_op: bool, fp32_sum: bool, reduction: str
) -> tuple[Tensor, Tensor, Tensor]:
    return _norm_fwd(x, residual, weight, eps, per_op, fp32_sum, reduction=reduction)


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, per_op, fp32_sum, reduction):
    return (
        x.new_empty(x.shape),
        x.new_empty(x.shape),
        x.new_empty(x.shape[:-1], dtype=torch.float32),
    )


@torch.library.custom_op("rla::rms_norm_backward", mutates_args=())
def _norm_bwd_op(
    dy: Tensor,
    dresidual: Optional[Tensor],
    a: Tensor,
    b: Optional[Tensor],
    weight: Tensor,
    rstd: Tensor,
    need_dw: bool,
    lp: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(d_v, d_weight) for v = a (+ b); d_weight is empty when ``need_dw`` is False."""
    dx, dw = _norm_bwd(dy, dresidual, a, b, weight, rstd, need_dw, lp)
    return dx, (dw if dw is not None else weight.new_empty(0))


@_norm_bwd_op.register_fake
def _(dy, dresidual, a, b, weight, rstd, need_dw, lp):
    return a.new_empty(a.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _, _, lp, _, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.lp = lp


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = _norm_bwd_op(dy, None, x, None, weight, rstd, need_dw, ctx.lp)
    return dx, (dw if need_dw else None), None, None, None, None, None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


def _add_rms_norm_save(ctx, x, residual, weight, new_residual, rstd, fp32_sum):
    ctx.fp32_sum = fp32_sum
    if fp32_sum:  # the fp32 sum is rebuilt from x and r
        ctx.save_for_backward(x, residual, weight, rstd)
    else:  # the norm read RN(x + r), which is an output kept alive as the next residual anyway
        ctx.save_for_backward(new_residual, weight, rstd)


def _add_rms_norm_saved(ctx):
    if ctx.fp32_sum:
        return ctx.saved_tensors
    (a, weight, rstd), b = ctx.saved_tensors, None
    return a, b, weight, rstd


def _add_rms_norm_setup(ctx, inputs, output):
    x, residual, weight, _, _, fp32_sum, _ = inputs
    _add_rms_norm_save(ctx, x, residual, weight, output[1], output[2], fp32_sum)


def _add_rms_norm_backward(ctx, dnormed, dresidual, _drstd):
    a, b, weight, rstd = _add_rms_norm_saved(ctx)
    need_dw = ctx.needs_input_grad[2]
    dv, dw = _norm_bwd_op(dnormed, dresidual, a, b, weight, rstd, need_dw, a.dtype)
    # d_x = d_r: one tensor handed to both inputs, as autograd's own add does.
    return dv, dv, (dw if need_dw else None), None, None, None, None


_add_rms_norm_op.register_autograd(_add_rms_norm_backward, setup_context=_add_rms_norm_setup)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float, per_op: bool, lp: torch.dtype, out_dtype: torch.dtype,
                reduction: str, after_add: bool):
        y, _, rstd = _norm_fwd(x, None, weight, eps, per_op, False, lp, out_dtype, reduction, after_add)
        ctx.save_for_backward(x, weight, rstd)
        ctx.lp = lp
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1]
        dx, dw = _norm_bwd(dy, None, x, None, weight, rstd, need_dw, ctx.lp)
        return dx, dw, None, None, None, None, None, None


class _AddRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, per_op: bool, fp32_sum: bool, reduction: str):
        y, new_residual, rstd = _norm_fwd(x, residual, weight, eps, per_op, fp32_sum, reduction=reduction)
        _add_rms_norm_save(ctx, x, residual, weight, new_residual, rstd, fp32_sum)
        return y, new_residual

    @staticmethod
    def backward(ctx, dnormed, dresidual):
        a, b, weight, rstd = _add_rms_norm_saved(ctx)
        need_dw = ctx.needs_input_grad[2]
        dv, dw = _norm_bwd(dnormed, dresidual, a, b, weight, rstd, need_dw, a.dtype)
        return dv, dv, dw, None, None, None, None


def rms_norm(x, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None, out_dtype=None,
             after_add: bool = False):
    """Fused RMSNorm; see ``rla.ops.rms_norm`` (``dtype``: the stack dtype, default x's;
    ``out_dtype``: fp32 for the unrounded output of the ``qk_norm_out='fp32'`` chain)."""
    lp = x.dtype if dtype is None else dtype
    args = (float(eps), profile.norm_weight == "per_op", lp, out_dtype or lp, profile.norm_reduction, after_add)
    if _compiling():
        return _rms_norm_op(x, weight, *args)[0]
    return _RMSNormFn.apply(x, weight, *args)


def add_rms_norm(x, residual, weight, eps: float, profile: RoundingProfile):
    """Fused residual add + RMSNorm -> (normed, new_residual); see ``rla.ops.add_rms_norm``."""
    flags = (float(eps), profile.norm_weight == "per_op", profile.norm_residual == "fp32_sum", profile.norm_reduction)
    if _compiling():
        normed, new_residual, _ = _add_rms_norm_op(x, residual, weight, *flags)
        return normed, new_residual
    return _AddRMSNormFn.apply(x, residual, weight, *flags)


# --------------------------------------------------------------------------------------------
# The fp32_carry residual add
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("rla::carry_add", mutates_args=())
def _carry_add_op(x: Tensor, residual: Tensor, m: Tensor, out_dtype: torch.dtype) -> Tensor:
    from rla.ops import _triton_add

    return _triton_add.forward(x, residual, m, out_dtype)


@_carry_add_op.register_fake
def _(x, residual, m, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


def _carry_add_setup(ctx, inputs, output):
    x, residual, m, _ = inputs
    ctx.dtypes = (x.dtype, residual.dtype, m.dtype)


def _carry_add_backward(ctx, g):
    return tuple(g.to(d) for d in ctx.dtypes) + (None,)


_carry_add_op.register_autograd(_carry_add_backward, setup_context=_carry_add_setup)


class _CarryAddFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, m, out_dtype: torch.dtype):
        from rla.ops import _triton_add

        ctx.dtypes = (x.dtype, residual.dtype, m.dtype)
        return _triton_add.forward(x, residual, m, out_dtype)

    backward = staticmethod(_carry_add_backward)


def carry_add(x, residual, m, out_dtype: torch.dtype):
    """Fused (x + residual) + m, one read of each, one rounding; see ``rla.ops.carry_add``."""
    return (_carry_add_op if _compiling() else _CarryAddFn.apply)(x, residual, m, out_dtype)


# --------------------------------------------------------------------------------------------
# q/k norm -> RoPE (qk_norm_out='fp32'): one kernel forward, one backward
# --------------------------------------------------------------------------------------------


def _qk_fwd(q, k, wq, wk, eps_q, eps_k, cos, sin, round_cos_sin, per_op_rope, per_op_norm, reduction, head_axis):
    from rla.ops import _triton_qk_norm_rope

    return _triton_qk_norm_rope.forward(q, k, wq, wk, eps_q, eps_k, cos, sin, round_cos_sin, per_op_rope,
                                        per_op_norm, reduction, head_axis)


def _qk_bwd(gq, gk, q, k, wq, wk, cos, sin, rq, rk, round_cos_sin, head_axis, need_dwq, need_dwk):
    from rla.ops import _triton_qk_norm_rope

    return _triton_qk_norm_rope.backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, round_cos_sin, head_axis,
                                         need_dwq, need_dwk)


@torch.library.custom_op("rla::qk_norm_rope", mutates_args=())
def _qk_norm_rope_op(
    q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, q_eps: float, k_eps: float, cos: Tensor, sin: Tensor,
    round_cos_sin: bool, per_op_rope: bool, per_op_norm: bool, reduction: str, head_axis: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _qk_fwd(q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope, per_op_norm,
                   reduction, head_axis)


def _rows_of(x: Tensor, head_axis: int) -> int:
    return x.shape[0] * x.shape[3 - head_axis] * x.shape[head_axis]


@_qk_norm_rope_op.register_fake
def _(q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope, per_op_norm, reduction, head_axis):
    return (
        token_major(q, head_axis),
        token_major(k, head_axis),
        q.new_empty((_rows_of(q, head_axis),), dtype=torch.float32),
        k.new_empty((_rows_of(k, head_axis),), dtype=torch.float32),
    )


@torch.library.custom_op("rla::qk_norm_rope_backward", mutates_args=())
def _qk_norm_rope_bwd_op(
    gq: Tensor, gk: Tensor, q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
    rstd_q: Tensor, rstd_k: Tensor, round_cos_sin: bool, head_axis: int, need_dwq: bool, need_dwk: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(d_q, d_k, d_q_weight, d_k_weight); a d_weight is empty when it is not needed."""
    dq, dk, dwq, dwk = _qk_bwd(gq, gk, q, k, q_weight, k_weight, cos, sin, rstd_q, rstd_k, round_cos_sin,
                               head_axis, need_dwq, need_dwk)
    return dq, dk, (dwq if dwq is not None else q_weight.new_empty(0)), (dwk if dwk is not None else k_weight.new_empty(0))


@_qk_norm_rope_bwd_op.register_fake
def _(gq, gk, q, k, q_weight, k_weight, cos, sin, rstd_q, rstd_k, round_cos_sin, head_axis, need_dwq, need_dwk):
    return (
        token_major(q, head_axis),
        token_major(k, head_axis),
        q_weight.new_empty(q_weight.shape if need_dwq else (0,)),
        k_weight.new_empty(k_weight.shape if need_dwk else (0,)),
    )


def _qk_save(ctx, q, k, wq, wk, cos, sin, rq, rk, round_cos_sin, head_axis):
    ctx.save_for_backward(q, k, wq, wk, cos, sin, rq, rk)
    ctx.flags = (round_cos_sin, head_axis)


def _qk_setup(ctx, inputs, output):
    q, k, wq, wk, _, _, cos, sin, round_cos_sin, _, _, _, head_axis = inputs
    _qk_save(ctx, q, k, wq, wk, cos, sin, output[2], output[3], round_cos_sin, head_axis)


def _qk_backward(ctx, gq, gk, _drq, _drk):
    q, k, wq, wk, cos, sin, rq, rk = ctx.saved_tensors
    need_wq, need_wk = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    dq, dk, dwq, dwk = _qk_norm_rope_bwd_op(gq, gk, q, k, wq, wk, cos, sin, rq, rk, *ctx.flags, need_wq, need_wk)
    return (dq, dk, (dwq if need_wq else None), (dwk if need_wk else None)) + (None,) * 9


_qk_norm_rope_op.register_autograd(_qk_backward, setup_context=_qk_setup)


class _QkNormRopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, wq, wk, eps_q: float, eps_k: float, cos, sin, round_cos_sin: bool, per_op_rope: bool,
                per_op_norm: bool, reduction: str, head_axis: int):
        oq, ok, rq, rk = _qk_fwd(q, k, wq, wk, eps_q, eps_k, cos, sin, round_cos_sin, per_op_rope, per_op_norm,
                                 reduction, head_axis)
        _qk_save(ctx, q, k, wq, wk, cos, sin, rq, rk, round_cos_sin, head_axis)
        return oq, ok

    @staticmethod
    def backward(ctx, gq, gk):
        q, k, wq, wk, cos, sin, rq, rk = ctx.saved_tensors
        need_wq, need_wk = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        dq, dk, dwq, dwk = _qk_bwd(gq, gk, q, k, wq, wk, cos, sin, rq, rk, *ctx.flags, need_wq, need_wk)
        return (dq, dk, dwq, dwk) + (None,) * 9


def qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin, profile: RoundingProfile, unsqueeze_dim: int = 1,
                 dtype=None):
    """Fused q/k RMSNorm -> RoPE (one kernel each way); see ``rla.ops.qk_norm_rope``. Layouts the
    kernel does not cover run the two-op chain on the fused norm and RoPE kernels (same numbers)."""
    q_eps, k_eps = (eps, eps) if isinstance(eps, (int, float)) else eps
    lp = dtype or q.dtype
    axis = _rope_head_axis(q, k, cos, unsqueeze_dim)
    if axis is None or q.dtype != lp or q.shape[-1] > 65536 or q.shape[-1] % 2:
        return reference.compose_qk_norm_rope(rms_norm, rope, q, k, q_weight, k_weight, (q_eps, k_eps), cos, sin,
                                              profile, unsqueeze_dim, lp)
    flags = (float(q_eps), float(k_eps), cos, sin, profile.rope_cos_sin == "round", profile.rope_apply == "per_op",
             profile.norm_weight == "per_op", profile.norm_reduction, axis)
    if _compiling():
        oq, ok, _, _ = _qk_norm_rope_op(q, k, q_weight, k_weight, *flags)
        return oq, ok
    return _QkNormRopeFn.apply(q, k, q_weight, k_weight, *flags)
