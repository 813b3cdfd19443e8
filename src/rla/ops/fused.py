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

Two doors to the same launchers, generated from one description per op (``rla.ops._op_spec``):
under ``torch.compile`` each op is a ``torch.library.custom_op`` with ``register_fake`` (shapes for
FakeTensor tracing) and ``register_autograd`` (backward = another custom op), checked with
``torch.library.opcheck``: the compiled graph holds them as opaque nodes with symbolic shapes (no
recompile when the sequence length changes, after the first dynamic recompile). In eager mode the
same launchers and the same save / grad rules run through a generated ``torch.autograd.Function``,
because the custom-op dispatcher costs tens of microseconds of host time per call, longer than the
RoPE kernel itself. CUDA graphs capture either. Saved for backward: the inputs (the rounded sum
instead of x and r for the ``rounded_sum`` add+norm; the fp32 tensor r was rounded from instead of
r for ``add_rms_norm(residual_source=)``, read back as RN of it; x and s for the norm whose mean
square is s's, ``rms_norm(variance_of=s)``) and one fp32 rstd per norm row; everything else is
recomputed. The q/k norm -> RoPE chain (``qk_norm_rope``) is one kernel each way whose row
math is the norm kernels' own helpers, so it equals the chain of ``rms_norm(out_dtype=fp32)`` and
``rope`` bit for bit; it keeps q, k and one rstd per (token, head) row, and no fp32 q/k at all.

Each region below reads top-down: the launchers and fakes, the description (``Kernel`` /
``OpSpec``: named, typed flags; what is saved; the gradient rule), then the public function,
which maps a profile to the flags by name.

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
from rla.ops._op_spec import Kernel, Op, OpSpec
from rla.profiles import RoundingProfile

__all__ = ["available", "rope", "swiglu", "geglu", "swiglu_oai", "rms_norm", "rms_norm_and_round", "add_rms_norm",
           "rms_norm_variance_of", "carry_add", "qk_norm_rope"]

_HAS_TRITON = importlib.util.find_spec("triton") is not None
_ENABLED = os.environ.get("RLA_FUSED", "1") != "0"
_OptTensor = Optional[Tensor]


def available(*tensors: Tensor) -> bool:
    """True when the fused kernels can run on these tensors: all on CUDA and Triton installed.

    Written in what Dynamo traces on every supported torch (``bool(tuple)`` is a graph break under
    torch 2.11: one per op call, which made a compiled aligned step slower than an eager one)."""
    return _ENABLED and _HAS_TRITON and len(tensors) > 0 and all([t.is_cuda for t in tensors])


def _or_empty(grad: Optional[Tensor], like: Tensor) -> Tensor:
    """A d_weight a custom op may return: the kernel's, or an empty tensor where it was not asked for
    (a custom op cannot return ``None``; the grad rule turns it back into ``None``)."""
    return grad if grad is not None else like.new_empty(0)


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def _rope_fwd(q, k, cos, sin, round_cos_sin, per_op, head_axis, out_dtype):
    from rla.ops import _triton_rope

    return _triton_rope.launch(q, k, cos, sin, round_cos_sin, per_op, False, head_axis, out_dtype)


def _rope_fwd_fake(q, k, cos, sin, round_cos_sin, per_op, head_axis, out_dtype):
    return output_like(q, out_dtype), output_like(k, out_dtype)


def _rope_bwd(gq, gk, cos, sin, round_cos_sin, head_axis, out_dtype):
    """The transposed rotation of the output gradients, in the input's dtype (``out_dtype``)."""
    from rla.ops import _triton_rope

    return _triton_rope.launch(gq, gk, cos, sin, round_cos_sin, False, True, head_axis, out_dtype)


def _rope_bwd_fake(gq, gk, cos, sin, round_cos_sin, head_axis, out_dtype):
    return output_like(gq, out_dtype), output_like(gk, out_dtype)


def _rope_save(ctx, outputs, q, k, cos, sin, round_cos_sin, per_op, head_axis, out_dtype):
    ctx.save_for_backward(cos, sin)
    ctx.round_cos_sin, ctx.head_axis, ctx.in_dtype = round_cos_sin, head_axis, q.dtype


def _rope_grad(ctx, backward, gq, gk):
    cos, sin = ctx.saved_tensors
    return backward(gq, gk, cos, sin, ctx.round_cos_sin, ctx.head_axis, ctx.in_dtype)


_ROPE_BWD = Kernel(
    "rope_backward",
    dict(gq=Tensor, gk=Tensor, cos=Tensor, sin=Tensor, round_cos_sin=bool, head_axis=int, out_dtype=torch.dtype),
    outputs=2, launch=_rope_bwd, fake=_rope_bwd_fake,
)
_ROPE = Op(OpSpec(
    Kernel(
        "rope",
        dict(q=Tensor, k=Tensor, cos=Tensor, sin=Tensor, round_cos_sin=bool, per_op=bool, head_axis=int,
             out_dtype=torch.dtype),
        outputs=2, launch=_rope_fwd, fake=_rope_fwd_fake,
    ),
    returns=2, save=_rope_save, grad=_rope_grad, backward=_ROPE_BWD, function_name="_RopeFn",
))


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
    return _ROPE(q, k, cos, sin, round_cos_sin=profile.rope_cos_sin == "round", per_op=profile.rope_apply == "per_op",
                 head_axis=axis, out_dtype=dtype or q.dtype)


# --------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------


def _swiglu_fwd(gate, up, per_op):
    from rla.ops import _triton_swiglu

    return _triton_swiglu.forward(gate, up, per_op)


def _swiglu_fwd_fake(gate, up, per_op):
    return gate.new_empty(gate.shape)


def _swiglu_bwd(dy, gate, up):
    from rla.ops import _triton_swiglu

    return _triton_swiglu.backward(dy, gate, up)


def _swiglu_bwd_fake(dy, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _swiglu_save(ctx, outputs, gate, up, per_op):
    ctx.save_for_backward(gate, up)


def _swiglu_grad(ctx, backward, dy):
    gate, up = ctx.saved_tensors
    return backward(dy, gate, up)


_SWIGLU = Op(OpSpec(
    Kernel("swiglu", dict(gate=Tensor, up=Tensor, per_op=bool), outputs=1, launch=_swiglu_fwd, fake=_swiglu_fwd_fake),
    returns=1, save=_swiglu_save, grad=_swiglu_grad, function_name="_SwiGLUFn",
    backward=Kernel("swiglu_backward", dict(dy=Tensor, gate=Tensor, up=Tensor), outputs=2, launch=_swiglu_bwd,
                    fake=_swiglu_bwd_fake),
))


def swiglu(gate, up, profile: RoundingProfile):
    """Fused silu(gate) * up; see ``rla.ops.swiglu``."""
    return _SWIGLU(gate, up, per_op=profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# GeGLU (tanh approximation): the same shape of op as SwiGLU, its own kernels
# --------------------------------------------------------------------------------------------


def _geglu_fwd(gate, up, per_op):
    from rla.ops import _triton_geglu

    return _triton_geglu.forward(gate, up, per_op)


def _geglu_bwd(dy, gate, up):
    from rla.ops import _triton_geglu

    return _triton_geglu.backward(dy, gate, up)


_GEGLU = Op(OpSpec(
    Kernel("geglu", dict(gate=Tensor, up=Tensor, per_op=bool), outputs=1, launch=_geglu_fwd, fake=_swiglu_fwd_fake),
    returns=1, save=_swiglu_save, grad=_swiglu_grad, function_name="_GeGLUFn",
    backward=Kernel("geglu_backward", dict(dy=Tensor, gate=Tensor, up=Tensor), outputs=2, launch=_geglu_bwd,
                    fake=_swiglu_bwd_fake),
))


def geglu(gate, up, profile: RoundingProfile):
    """Fused gelu_tanh(gate) * up; see ``rla.ops.geglu``."""
    return _GEGLU(gate, up, per_op=profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# GPT-OSS's clamped SwiGLU
# --------------------------------------------------------------------------------------------


def _swiglu_oai_fwd(gate, up, alpha, limit, per_op, quotient):
    from rla.ops import _triton_swiglu_oai

    return _triton_swiglu_oai.forward(gate, up, alpha, limit, per_op, quotient)


def _swiglu_oai_fwd_fake(gate, up, alpha, limit, per_op, quotient):
    return gate.new_empty(gate.shape)


def _swiglu_oai_bwd(dy, gate, up, alpha, limit):
    from rla.ops import _triton_swiglu_oai

    return _triton_swiglu_oai.backward(dy, gate, up, alpha, limit)


def _swiglu_oai_bwd_fake(dy, gate, up, alpha, limit):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _swiglu_oai_save(ctx, outputs, gate, up, alpha, limit, per_op, quotient):
    ctx.save_for_backward(gate, up)
    ctx.alpha, ctx.limit = alpha, limit


def _swiglu_oai_grad(ctx, backward, dy):
    gate, up = ctx.saved_tensors
    return backward(dy, gate, up, ctx.alpha, ctx.limit)


_SWIGLU_OAI = Op(OpSpec(
    Kernel("swiglu_oai", dict(gate=Tensor, up=Tensor, alpha=float, limit=float, per_op=bool, quotient=bool),
           outputs=1,
           launch=_swiglu_oai_fwd, fake=_swiglu_oai_fwd_fake),
    returns=1, save=_swiglu_oai_save, grad=_swiglu_oai_grad, function_name="_SwiGLUOAIFn",
    backward=Kernel("swiglu_oai_backward", dict(dy=Tensor, gate=Tensor, up=Tensor, alpha=float, limit=float),
                    outputs=2, launch=_swiglu_oai_bwd, fake=_swiglu_oai_bwd_fake),
))


def swiglu_oai(gate, up, alpha: float, limit: float, profile: RoundingProfile):
    """Fused GPT-OSS clamped SwiGLU; see ``rla.ops.swiglu_oai``."""
    return _SWIGLU_OAI(gate, up, alpha=float(alpha), limit=float(limit), per_op=profile.swiglu == "per_op",
                       quotient=profile.oai_glu == "quotient")


# --------------------------------------------------------------------------------------------
# RMSNorm and residual-add + RMSNorm: one backward kernel for both
# --------------------------------------------------------------------------------------------


def _norm_fwd(x, residual, weight, eps, per_op, fp32_sum, lp=None, out_dtype=None, reduction="unpinned",
              after_add=False, rounded=None):
    """The forward launcher of ``reduction``'s order: Triton's own tree, or vLLM's block
    reduction (``rla.ops.reduction``) for a norm after a residual add (``residual`` given, or
    ``after_add``: the sum was formed by the previous layer) or a plain one. ``rounded``: whether
    RN of the norm's input (x + r, or x) is written too (``_triton_norm.stores_rounded``)."""
    if reduction == "vllm_block":
        from rla.ops import _triton_norm_tree
        from rla.ops.reduction import call_tree

        tree = call_tree(x, fused_add=residual is not None or after_add)
        return _triton_norm_tree.forward(x, residual, weight.contiguous(), eps, per_op, fp32_sum, tree, lp, out_dtype,
                                         rounded)
    from rla.ops import _triton_norm

    return _triton_norm.forward(x, residual, weight.contiguous(), eps, per_op, fp32_sum, lp, out_dtype, rounded)


def _norm_bwd(dy, dresidual, a, b, weight, rstd, need_dw, lp):
    """(d_v, d_weight) for v = a (+ b); d_weight is empty when ``need_dw`` is False."""
    from rla.ops import _triton_norm

    dx, dw = _triton_norm.backward(dy, dresidual, a, b, weight.contiguous(), rstd, need_dw, lp)
    return dx, _or_empty(dw, weight)


def _norm_bwd_fake(dy, dresidual, a, b, weight, rstd, need_dw, lp):
    return a.new_empty(a.shape), weight.new_empty(weight.shape if need_dw else (0,))


_NORM_BWD = Kernel(
    "rms_norm_backward",
    dict(dy=Tensor, dresidual=_OptTensor, a=Tensor, b=_OptTensor, weight=Tensor, rstd=Tensor, need_dw=bool,
         lp=torch.dtype),
    outputs=2, launch=_norm_bwd, fake=_norm_bwd_fake,
)


def _rms_norm_fwd(x, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    y, _, rstd = _norm_fwd(x, None, weight, eps, per_op, False, lp, out_dtype, reduction, after_add)
    return y, rstd


def _rms_norm_fwd_fake(x, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _rms_norm_save(ctx, outputs, x, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    ctx.save_for_backward(x, weight, outputs[1])
    ctx.lp = lp


def _rms_norm_grad(ctx, backward, dy, drounded=None):
    """The norm's backward; ``drounded``: the gradient of RN(x) beside it (``rms_norm_and_round``), added to d_x
    in the same kernel (its residual-gradient input)."""
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = backward(dy, drounded, x, None, weight, rstd, need_dw, ctx.lp)
    return dx, (dw if need_dw else None)


_RMS_NORM = Op(OpSpec(
    Kernel(
        "rms_norm",
        dict(x=Tensor, weight=Tensor, eps=float, per_op=bool, lp=torch.dtype, out_dtype=torch.dtype, reduction=str,
             after_add=bool),
        outputs=2, launch=_rms_norm_fwd, fake=_rms_norm_fwd_fake,
    ),
    returns=1, save=_rms_norm_save, grad=_rms_norm_grad, backward=_NORM_BWD, function_name="_RMSNormFn",
))


def _add_rms_norm_fwd(x, residual, weight, eps, per_op, fp32_sum, reduction):
    return _norm_fwd(x, residual, weight, eps, per_op, fp32_sum, reduction=reduction)


def _add_rms_norm_fwd_fake(x, residual, weight, eps, per_op, fp32_sum, reduction):
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _add_rms_norm_save(ctx, outputs, x, residual, weight, eps, per_op, fp32_sum, reduction):
    ctx.fp32_sum = fp32_sum
    if fp32_sum:  # the fp32 sum is rebuilt from x and r
        ctx.save_for_backward(x, residual, weight, outputs[2])
    else:  # the norm read RN(x + r), which is an output kept alive as the next residual anyway
        ctx.save_for_backward(outputs[1], weight, outputs[2])


def _add_rms_norm_grad(ctx, backward, dnormed, dresidual):
    if ctx.fp32_sum:
        a, b, weight, rstd = ctx.saved_tensors
    else:
        (a, weight, rstd), b = ctx.saved_tensors, None
    need_dw = ctx.needs_input_grad[2]
    dv, dw = backward(dnormed, dresidual, a, b, weight, rstd, need_dw, a.dtype)
    # d_x = d_r: one tensor handed to both inputs, as autograd's own add does.
    return dv, dv, (dw if need_dw else None)


_ADD_RMS_NORM = Op(OpSpec(
    Kernel(
        "add_rms_norm",
        dict(x=Tensor, residual=Tensor, weight=Tensor, eps=float, per_op=bool, fp32_sum=bool, reduction=str),
        outputs=3, launch=_add_rms_norm_fwd, fake=_add_rms_norm_fwd_fake,
    ),
    returns=2, save=_add_rms_norm_save, grad=_add_rms_norm_grad, backward=_NORM_BWD, function_name="_AddRMSNormFn",
))


# add + norm of a residual given with the fp32 tensor it was rounded from (fp32_sum): the same
# forward kernel; the fp32 source is kept instead of the residual, and the backward's second
# entry reads it as RN(source), which is the residual bit for bit. In an aligned layer the
# source is the previous layer's fp32 sum, which the input norm keeps anyway: 2 bytes per
# element and layer less than keeping r = RN(s) beside it.


def _norm_bwd_of_source(dy, dresidual, a, source, weight, rstd, need_dw, lp):
    """(d_v, d_weight) for v = a + RN(source), ``source`` fp32 rounded to ``lp`` as it is read."""
    from rla.ops import _triton_norm

    dx, dw = _triton_norm.backward(dy, dresidual, a, source, weight.contiguous(), rstd, need_dw, lp, round_b=True)
    return dx, _or_empty(dw, weight)


def _norm_bwd_of_source_fake(dy, dresidual, a, source, weight, rstd, need_dw, lp):
    return a.new_empty(a.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _add_rms_norm_of_source_fwd(x, residual, source, weight, eps, per_op, reduction):
    return _norm_fwd(x, residual, weight, eps, per_op, True, reduction=reduction)


def _add_rms_norm_of_source_fwd_fake(x, residual, source, weight, eps, per_op, reduction):
    return _add_rms_norm_fwd_fake(x, residual, weight, eps, per_op, True, reduction)


def _add_rms_norm_of_source_save(ctx, outputs, x, residual, source, weight, eps, per_op, reduction):
    ctx.save_for_backward(x, source, weight, outputs[2])


def _add_rms_norm_of_source_grad(ctx, backward, dnormed, dresidual):
    a, source, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[3]
    dv, dw = backward(dnormed, dresidual, a, source, weight, rstd, need_dw, a.dtype)
    # d_x = d_r as in add_rms_norm; the source gets none (its gradient reaches it through r)
    return dv, dv, None, (dw if need_dw else None)


_NORM_BWD_OF_SOURCE = Kernel(
    "rms_norm_backward_of_source",
    dict(dy=Tensor, dresidual=_OptTensor, a=Tensor, source=Tensor, weight=Tensor, rstd=Tensor, need_dw=bool,
         lp=torch.dtype),
    outputs=2, launch=_norm_bwd_of_source, fake=_norm_bwd_of_source_fake,
)
_ADD_RMS_NORM_OF_SOURCE = Op(OpSpec(
    Kernel(
        "add_rms_norm_of_source",
        dict(x=Tensor, residual=Tensor, source=Tensor, weight=Tensor, eps=float, per_op=bool, reduction=str),
        outputs=3, launch=_add_rms_norm_of_source_fwd, fake=_add_rms_norm_of_source_fwd_fake,
    ),
    returns=2, save=_add_rms_norm_of_source_save, grad=_add_rms_norm_of_source_grad, function_name="_AddRMSNormOfSourceFn",
    backward=_NORM_BWD_OF_SOURCE,
))


# add + norm without the residual handed on (fp32_sum only: ``add_rms_norm(new_residual=False)``).
# Under residual_stream='fp32_carry' the MLP's add rebuilds x + r from x and r (carry_add) and
# nothing reads RN(x + r): the same forward kernels with that store off (2 bytes per element
# not written, no buffer allocated). fp32_sum keeps x and r (or the source) and not the rounded
# sum, so the saved tensors and the backward are those of the two ops above, with no residual
# gradient.


def _add_rms_norm_normed_fwd(x, residual, weight, eps, per_op, reduction):
    y, _, rstd = _norm_fwd(x, residual, weight, eps, per_op, True, reduction=reduction, rounded=False)
    return y, rstd


def _add_rms_norm_normed_fwd_fake(x, residual, weight, eps, per_op, reduction):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _add_rms_norm_normed_save(ctx, outputs, x, residual, weight, eps, per_op, reduction):
    ctx.save_for_backward(x, residual, weight, outputs[1])


def _add_rms_norm_normed_grad(ctx, backward, dnormed):
    a, b, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[2]
    dv, dw = backward(dnormed, None, a, b, weight, rstd, need_dw, a.dtype)
    return dv, dv, (dw if need_dw else None)


_ADD_RMS_NORM_NORMED = Op(OpSpec(
    Kernel(
        "add_rms_norm_normed",
        dict(x=Tensor, residual=Tensor, weight=Tensor, eps=float, per_op=bool, reduction=str),
        outputs=2, launch=_add_rms_norm_normed_fwd, fake=_add_rms_norm_normed_fwd_fake,
    ),
    returns=1, save=_add_rms_norm_normed_save, grad=_add_rms_norm_normed_grad, backward=_NORM_BWD,
    function_name="_AddRMSNormNormedFn",
))


def _add_rms_norm_of_source_normed_fwd(x, residual, source, weight, eps, per_op, reduction):
    return _add_rms_norm_normed_fwd(x, residual, weight, eps, per_op, reduction)


def _add_rms_norm_of_source_normed_fwd_fake(x, residual, source, weight, eps, per_op, reduction):
    return _add_rms_norm_normed_fwd_fake(x, residual, weight, eps, per_op, reduction)


def _add_rms_norm_of_source_normed_save(ctx, outputs, x, residual, source, weight, eps, per_op, reduction):
    ctx.save_for_backward(x, source, weight, outputs[1])


def _add_rms_norm_of_source_normed_grad(ctx, backward, dnormed):
    a, source, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[3]
    dv, dw = backward(dnormed, None, a, source, weight, rstd, need_dw, a.dtype)
    return dv, dv, None, (dw if need_dw else None)


_ADD_RMS_NORM_OF_SOURCE_NORMED = Op(OpSpec(
    Kernel(
        "add_rms_norm_of_source_normed",
        dict(x=Tensor, residual=Tensor, source=Tensor, weight=Tensor, eps=float, per_op=bool, reduction=str),
        outputs=2, launch=_add_rms_norm_of_source_normed_fwd, fake=_add_rms_norm_of_source_normed_fwd_fake,
    ),
    returns=1, save=_add_rms_norm_of_source_normed_save, grad=_add_rms_norm_of_source_normed_grad,
    backward=_NORM_BWD_OF_SOURCE, function_name="_AddRMSNormOfSourceNormedFn",
))


# RMSNorm of an fp32 residual sum that also hands on its rounding: (norm(s), RN(s)) from one read
# of s (``rla.ops.rms_norm_and_round``; a decoder layer's input norm under fp32_sum, whose residual
# is RN(s)). The forward is the norm kernel with the rounded copy stored beside y; the backward is
# the norm's backward kernel with RN(s)'s gradient as its residual gradient: d_s = d_norm + d_r
# in fp32, the one add autograd does for the two ops (rms_norm, s.to(lp)), in the same kernel.
# Saved: s, the weight, rstd, as rms_norm keeps; RN(s) is not kept.


def _rms_norm_and_round_fwd(x, weight, eps, per_op, lp, reduction, after_add):
    return _norm_fwd(x, None, weight, eps, per_op, False, lp, None, reduction, after_add, rounded=True)


def _rms_norm_and_round_fwd_fake(x, weight, eps, per_op, lp, reduction, after_add):
    return (x.new_empty(x.shape, dtype=lp), x.new_empty(x.shape, dtype=lp),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


def _rms_norm_and_round_save(ctx, outputs, x, weight, eps, per_op, lp, reduction, after_add):
    ctx.save_for_backward(x, weight, outputs[2])
    ctx.lp = lp


_RMS_NORM_AND_ROUND = Op(OpSpec(
    Kernel(
        "rms_norm_and_round",
        dict(x=Tensor, weight=Tensor, eps=float, per_op=bool, lp=torch.dtype, reduction=str, after_add=bool),
        outputs=3, launch=_rms_norm_and_round_fwd, fake=_rms_norm_and_round_fwd_fake,
    ),
    returns=2, save=_rms_norm_and_round_save, grad=_rms_norm_grad, backward=_NORM_BWD,
    function_name="_RMSNormAndRoundFn",
))


def rms_norm(x, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None, out_dtype=None,
             after_add: bool = False):
    """Fused RMSNorm; see ``rla.ops.rms_norm`` (``dtype``: the stack dtype, default x's;
    ``out_dtype``: fp32 for the unrounded output of the ``qk_norm_out='fp32'`` chain)."""
    lp = x.dtype if dtype is None else dtype
    return _RMS_NORM(x, weight, eps=float(eps), per_op=profile.norm_weight == "per_op", lp=lp,
                     out_dtype=out_dtype or lp, reduction=profile.norm_reduction, after_add=after_add)


def rms_norm_and_round(x, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None,
                       after_add: bool = False):
    """Fused (RMSNorm(x), RN(x)) from one read of x; see ``rla.ops.rms_norm_and_round``."""
    lp = x.dtype if dtype is None else dtype
    return _RMS_NORM_AND_ROUND(x, weight, eps=float(eps), per_op=profile.norm_weight == "per_op", lp=lp,
                               reduction=profile.norm_reduction, after_add=after_add)


def add_rms_norm(x, residual, weight, eps: float, profile: RoundingProfile, residual_source=None,
                 new_residual: bool = True):
    """Fused residual add + RMSNorm -> (normed, new_residual); see ``rla.ops.add_rms_norm``
    (``residual_source``: the fp32 tensor ``residual`` was rounded from, kept for backward in
    its place under ``fp32_sum``; the same numbers, forward and backward). ``new_residual``
    False returns ``normed`` alone; under ``fp32_sum`` RN(x + r) is then not written at all."""
    fp32_sum = profile.norm_residual == "fp32_sum"
    if not new_residual:
        if not fp32_sum:  # the norm read RN(x + r), which is also what backward keeps: written anyway
            return add_rms_norm(x, residual, weight, eps, profile)[0]
        per_op = profile.norm_weight == "per_op"
        if residual_source is not None:
            return _ADD_RMS_NORM_OF_SOURCE_NORMED(x, residual, residual_source, weight, eps=float(eps), per_op=per_op,
                                                  reduction=profile.norm_reduction)
        return _ADD_RMS_NORM_NORMED(x, residual, weight, eps=float(eps), per_op=per_op,
                                    reduction=profile.norm_reduction)
    if residual_source is not None and fp32_sum:
        return _ADD_RMS_NORM_OF_SOURCE(x, residual, residual_source, weight, eps=float(eps),
                                       per_op=profile.norm_weight == "per_op", reduction=profile.norm_reduction)
    return _ADD_RMS_NORM(x, residual, weight, eps=float(eps), per_op=profile.norm_weight == "per_op",
                         fp32_sum=profile.norm_residual == "fp32_sum", reduction=profile.norm_reduction)


# RMSNorm whose mean square is another tensor's (``rms_norm(..., variance_of=s)``; the norm of a
# compiled graph that stores x = RN(s) and reads s for the sum of squares): rla.ops._triton_norm_var,
# the norm kernels' reduction helpers over s, their normalisation of x. Saved: x, s, the weight and
# one fp32 rstd per row, as the reference (rla.ops.variance_norm) keeps. d_x and d_s are separate
# outputs (autograd adds them where x = RN(s) is in the graph).


def _rms_norm_variance_of_fwd(x, s, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    from rla.ops import _triton_norm_var

    return _triton_norm_var.forward(x, s, weight.contiguous(), eps, per_op, reduction == "vllm_block", after_add, lp,
                                    out_dtype)


def _rms_norm_variance_of_fwd_fake(x, s, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _rms_norm_variance_of_bwd(dy, x, s, weight, rstd, need_dx, need_ds, need_dw, lp):
    """(d_x, d_s, d_weight); each empty when not needed."""
    from rla.ops import _triton_norm_var

    dx, ds, dw = _triton_norm_var.backward(dy, x, s, weight.contiguous(), rstd, need_dx, need_ds, need_dw, lp)
    return _or_empty(dx, x), _or_empty(ds, s), _or_empty(dw, weight)


def _rms_norm_variance_of_bwd_fake(dy, x, s, weight, rstd, need_dx, need_ds, need_dw, lp):
    return (x.new_empty(x.shape if need_dx else (0,)), s.new_empty(s.shape if need_ds else (0,)),
            weight.new_empty(weight.shape if need_dw else (0,)))


def _rms_norm_variance_of_save(ctx, outputs, x, s, weight, eps, per_op, lp, out_dtype, reduction, after_add):
    ctx.save_for_backward(x, s, weight, outputs[1])
    ctx.lp = lp


def _rms_norm_variance_of_grad(ctx, backward, dy):
    x, s, weight, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad[:3]
    dx, ds, dw = backward(dy, x, s, weight, rstd, *need, ctx.lp)
    return tuple(g if n else None for g, n in zip((dx, ds, dw), need))


_RMS_NORM_VARIANCE_OF = Op(OpSpec(
    Kernel(
        "rms_norm_variance_of",
        dict(x=Tensor, s=Tensor, weight=Tensor, eps=float, per_op=bool, lp=torch.dtype, out_dtype=torch.dtype,
             reduction=str, after_add=bool),
        outputs=2, launch=_rms_norm_variance_of_fwd, fake=_rms_norm_variance_of_fwd_fake,
    ),
    returns=1, save=_rms_norm_variance_of_save, grad=_rms_norm_variance_of_grad, function_name="_RMSNormVarianceOfFn",
    backward=Kernel(
        "rms_norm_variance_of_backward",
        dict(dy=Tensor, x=Tensor, s=Tensor, weight=Tensor, rstd=Tensor, need_dx=bool, need_ds=bool, need_dw=bool,
             lp=torch.dtype),
        outputs=3, launch=_rms_norm_variance_of_bwd, fake=_rms_norm_variance_of_bwd_fake,
    ),
))


def rms_norm_variance_of(x, s, weight, eps: float, profile: RoundingProfile, dtype: torch.dtype | None = None,
                         out_dtype=None, after_add: bool = False):
    """Fused ``x * rsqrt(mean(s**2) + eps) * w``; see ``rla.ops.rms_norm(..., variance_of=s)`` and
    ``rla.ops.variance_norm``, whose reference it equals (bit for bit under ``vllm_block``)."""
    lp = x.dtype if dtype is None else dtype
    return _RMS_NORM_VARIANCE_OF(x, s, weight, eps=float(eps), per_op=profile.norm_weight == "per_op", lp=lp,
                                 out_dtype=out_dtype or lp, reduction=profile.norm_reduction,
                                 after_add=bool(after_add))


# --------------------------------------------------------------------------------------------
# The fp32_carry residual add: its gradient is the output gradient cast to each input's dtype
# --------------------------------------------------------------------------------------------


def _carry_add_fwd(x, residual, m, out_dtype):
    from rla.ops import _triton_add

    return _triton_add.forward(x, residual, m, out_dtype)


def _carry_add_fwd_fake(x, residual, m, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


def _casts_of(g: Tensor, *dtypes: torch.dtype) -> tuple[Tensor, ...]:
    """``g.to(d)`` for each of ``dtypes``, each distinct dtype cast once (the same tensor repeated)."""
    cast: dict = {}
    for d in dtypes:
        if d not in cast:
            cast[d] = g.to(d)
    return tuple(cast[d] for d in dtypes)


def _carry_add_save(ctx, outputs, x, residual, m, out_dtype):
    ctx.x_dtype, ctx.residual_dtype, ctx.m_dtype = x.dtype, residual.dtype, m.dtype


def _carry_add_grad(ctx, backward, g):
    # one cast per distinct dtype, handed to every input of that dtype (as the add + norm hands
    # one d_v to x and r): in an aligned layer the three inputs are lp and g is the fp32 sum's
    # gradient, so one cast kernel instead of three (4 bytes read, 2 written per element each)
    return _casts_of(g, ctx.x_dtype, ctx.residual_dtype, ctx.m_dtype)


_CARRY_ADD = Op(OpSpec(
    Kernel(
        "carry_add",
        dict(x=Tensor, residual=Tensor, m=Tensor, out_dtype=torch.dtype),
        outputs=1, launch=_carry_add_fwd, fake=_carry_add_fwd_fake,
    ),
    returns=1, save=_carry_add_save, grad=_carry_add_grad, backward=None, function_name="_CarryAddFn",
))


def carry_add(x, residual, m, out_dtype: torch.dtype):
    """Fused (x + residual) + m, one read of each, one rounding; see ``rla.ops.carry_add``."""
    return _CARRY_ADD(x, residual, m, out_dtype=out_dtype)


# --------------------------------------------------------------------------------------------
# q/k norm -> RoPE (qk_norm_out='fp32'): one kernel forward, one backward
# --------------------------------------------------------------------------------------------


def _qk_fwd(q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope, per_op_norm, reduction,
            head_axis):
    from rla.ops import _triton_qk_norm_rope

    return _triton_qk_norm_rope.forward(q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope,
                                        per_op_norm, reduction, head_axis)


def _rows_of(x: Tensor, head_axis: int) -> int:
    return x.shape[0] * x.shape[3 - head_axis] * x.shape[head_axis]


def _qk_fwd_fake(q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope, per_op_norm, reduction,
                 head_axis):
    return (
        token_major(q, head_axis),
        token_major(k, head_axis),
        q.new_empty((_rows_of(q, head_axis),), dtype=torch.float32),
        k.new_empty((_rows_of(k, head_axis),), dtype=torch.float32),
    )


def _qk_bwd(gq, gk, q, k, q_weight, k_weight, cos, sin, rstd_q, rstd_k, round_cos_sin, head_axis, need_dwq, need_dwk):
    """(d_q, d_k, d_q_weight, d_k_weight); a d_weight is empty when it is not needed."""
    from rla.ops import _triton_qk_norm_rope

    dq, dk, dwq, dwk = _triton_qk_norm_rope.backward(gq, gk, q, k, q_weight, k_weight, cos, sin, rstd_q, rstd_k,
                                                     round_cos_sin, head_axis, need_dwq, need_dwk)
    return dq, dk, _or_empty(dwq, q_weight), _or_empty(dwk, k_weight)


def _qk_bwd_fake(gq, gk, q, k, q_weight, k_weight, cos, sin, rstd_q, rstd_k, round_cos_sin, head_axis, need_dwq,
                 need_dwk):
    return (
        token_major(q, head_axis),
        token_major(k, head_axis),
        q_weight.new_empty(q_weight.shape if need_dwq else (0,)),
        k_weight.new_empty(k_weight.shape if need_dwk else (0,)),
    )


def _qk_save(ctx, outputs, q, k, q_weight, k_weight, q_eps, k_eps, cos, sin, round_cos_sin, per_op_rope, per_op_norm,
             reduction, head_axis):
    ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin, outputs[2], outputs[3])
    ctx.round_cos_sin, ctx.head_axis = round_cos_sin, head_axis


def _qk_grad(ctx, backward, gq, gk):
    q, k, wq, wk, cos, sin, rq, rk = ctx.saved_tensors
    need_wq, need_wk = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    dq, dk, dwq, dwk = backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, ctx.round_cos_sin, ctx.head_axis, need_wq,
                                need_wk)
    return dq, dk, (dwq if need_wq else None), (dwk if need_wk else None)


_QK_BWD = Kernel(
    "qk_norm_rope_backward",
    dict(gq=Tensor, gk=Tensor, q=Tensor, k=Tensor, q_weight=Tensor, k_weight=Tensor, cos=Tensor, sin=Tensor,
         rstd_q=Tensor, rstd_k=Tensor, round_cos_sin=bool, head_axis=int, need_dwq=bool, need_dwk=bool),
    outputs=4, launch=_qk_bwd, fake=_qk_bwd_fake,
)
_QK_NORM_ROPE = Op(OpSpec(
    Kernel(
        "qk_norm_rope",
        dict(q=Tensor, k=Tensor, q_weight=Tensor, k_weight=Tensor, q_eps=float, k_eps=float, cos=Tensor, sin=Tensor,
             round_cos_sin=bool, per_op_rope=bool, per_op_norm=bool, reduction=str, head_axis=int),
        outputs=4, launch=_qk_fwd, fake=_qk_fwd_fake,
    ),
    returns=2, save=_qk_save, grad=_qk_grad, backward=_QK_BWD, function_name="_QkNormRopeFn",
))


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
    return _QK_NORM_ROPE(q, k, q_weight, k_weight, q_eps=float(q_eps), k_eps=float(k_eps), cos=cos, sin=sin,
                         round_cos_sin=profile.rope_cos_sin == "round", per_op_rope=profile.rope_apply == "per_op",
                         per_op_norm=profile.norm_weight == "per_op", reduction=profile.norm_reduction, head_axis=axis)
