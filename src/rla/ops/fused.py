"""The fused GPU path of the three regions: Triton kernels behind ``torch.library`` custom ops.

Same functions and the same numbers as ``rla.ops.reference`` (bit for bit for RoPE and SwiGLU; for
the norms the row sum is reduced in another order, so an output may differ by one lp ulp), at
the memory-bandwidth floor: each region reads its inputs once and writes its outputs once, in one
kernel, forward and backward. ``rla.ops`` sends CUDA tensors here when :func:`available` says so;
the reference stays the CPU path and the oracle the GPU tests compare against.

Why Triton and not an Inductor-compiled reference: Inductor reaches the bandwidth floor too, but it
contracts ``a*b + c`` into FMAs and uses its own ``exp`` (so its outputs are not the spec's
one-op-at-a-time numbers), it recompiles per shape family, and it cannot run inside a model that
is not itself compiled. The kernels here are compiled with contraction off and call libdevice's
``expf``/``div.rn``/``rsqrtf``, the functions PyTorch's own CUDA kernels use (``_triton_common``).

Each op is a ``torch.library.custom_op`` with ``register_fake`` (shapes for FakeTensor tracing)
and ``register_autograd`` (backward = another custom op), checked with ``torch.library.opcheck``:
``torch.compile(model)`` treats them as opaque nodes with symbolic shapes (no recompile when the
sequence length changes, after the first dynamic recompile), and CUDA graphs capture their
launches. Saved for backward: the inputs (the rounded sum instead of x and r for the
``rounded_sum`` add+norm) and one fp32 rstd per norm row; everything else is recomputed.

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
from rla.profiles import RoundingProfile

__all__ = ["available", "rope", "swiglu", "rms_norm", "add_rms_norm"]

_HAS_TRITON = importlib.util.find_spec("triton") is not None
_ENABLED = os.environ.get("RLA_FUSED", "1") != "0"


def available(*tensors: Tensor) -> bool:
    """True when the fused kernels can run on these tensors: all on CUDA and Triton installed."""
    return _ENABLED and _HAS_TRITON and bool(tensors) and all(t.is_cuda for t in tensors)


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("rla::rope", mutates_args=())
def _rope_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, round_cos_sin: bool, per_op: bool
) -> tuple[Tensor, Tensor]:
    from rla.ops import _triton_rope

    return _triton_rope.launch(q, k, cos, sin, round_cos_sin, per_op, backward=False)


@_rope_op.register_fake
def _(q, k, cos, sin, round_cos_sin, per_op):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("rla::rope_backward", mutates_args=())
def _rope_bwd_op(
    gq: Tensor, gk: Tensor, cos: Tensor, sin: Tensor, round_cos_sin: bool
) -> tuple[Tensor, Tensor]:
    from rla.ops import _triton_rope

    return _triton_rope.launch(gq, gk, cos, sin, round_cos_sin, per_op=False, backward=True)


@_rope_bwd_op.register_fake
def _(gq, gk, cos, sin, round_cos_sin):
    return torch.empty_like(gq), torch.empty_like(gk)


def _rope_setup(ctx, inputs, output):
    _, _, cos, sin, round_cos_sin, _ = inputs
    ctx.save_for_backward(cos, sin)
    ctx.round_cos_sin = round_cos_sin


def _rope_backward(ctx, gq, gk):
    cos, sin = ctx.saved_tensors
    dq, dk = _rope_bwd_op(gq, gk, cos, sin, ctx.round_cos_sin)
    return dq, dk, None, None, None, None


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


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


def rope(q, k, cos, sin, profile: RoundingProfile, unsqueeze_dim: int = 1):
    """Fused RoPE of q and k (one launch); see ``rla.ops.rope``. Layouts the kernel does not
    cover (not 4-D, cos/sin broadcasting over heads in another way) run the reference."""
    axis = _rope_head_axis(q, k, cos, unsqueeze_dim)
    if axis is None:
        return reference.rope(q, k, cos, sin, profile, unsqueeze_dim)
    if axis == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    B, _, S, D = q.shape
    cos, sin = cos.expand(B, S, D), sin.expand(B, S, D)
    oq, ok = _rope_op(q, k, cos, sin, profile.rope_cos_sin == "round", profile.rope_apply == "per_op")
    if axis == 2:
        oq, ok = oq.transpose(1, 2), ok.transpose(1, 2)
    return oq, ok


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


def swiglu(gate, up, profile: RoundingProfile):
    """Fused silu(gate) * up; see ``rla.ops.swiglu``."""
    return _swiglu_op(gate, up, profile.swiglu == "per_op")


# --------------------------------------------------------------------------------------------
# RMSNorm and residual-add + RMSNorm
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("rla::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float, per_op: bool) -> tuple[Tensor, Tensor]:
    from rla.ops import _triton_norm

    y, _, rstd = _triton_norm.forward(x, None, weight.contiguous(), eps, per_op, False)
    return y, rstd


@_rms_norm_op.register_fake
def _(x, weight, eps, per_op):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("rla::add_rms_norm", mutates_args=())
def _add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, per_op: bool, fp32_sum: bool
) -> tuple[Tensor, Tensor, Tensor]:
    from rla.ops import _triton_norm

    return _triton_norm.forward(x, residual, weight.contiguous(), eps, per_op, fp32_sum)


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, per_op, fp32_sum):
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
) -> tuple[Tensor, Tensor]:
    """(d_v, d_weight) for v = a (+ b); d_weight is empty when ``need_dw`` is False."""
    from rla.ops import _triton_norm

    dx, dw = _triton_norm.backward(dy, dresidual, a, b, weight.contiguous(), rstd, need_dw)
    return dx, (dw if dw is not None else weight.new_empty(0))


@_norm_bwd_op.register_fake
def _(dy, dresidual, a, b, weight, rstd, need_dw):
    return a.new_empty(a.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = _norm_bwd_op(dy, None, x, None, weight, rstd, need_dw)
    return dx, (dw if need_dw else None), None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


def _add_rms_norm_setup(ctx, inputs, output):
    x, residual, weight, _, _, fp32_sum = inputs
    _, new_residual, rstd = output
    ctx.fp32_sum = fp32_sum
    if fp32_sum:  # the fp32 sum is rebuilt from x and r
        ctx.save_for_backward(x, residual, weight, rstd)
    else:  # the norm read RN(x + r), which is an output kept alive as the next residual anyway
        ctx.save_for_backward(new_residual, weight, rstd)


def _add_rms_norm_backward(ctx, dnormed, dresidual, _drstd):
    if ctx.fp32_sum:
        a, b, weight, rstd = ctx.saved_tensors
    else:
        (a, weight, rstd), b = ctx.saved_tensors, None
    need_dw = ctx.needs_input_grad[2]
    dv, dw = _norm_bwd_op(dnormed, dresidual, a, b, weight, rstd, need_dw)
    # d_x = d_r: one tensor handed to both inputs, as autograd's own add does.
    return dv, dv, (dw if need_dw else None), None, None, None


_add_rms_norm_op.register_autograd(_add_rms_norm_backward, setup_context=_add_rms_norm_setup)


def rms_norm(x, weight, eps: float, profile: RoundingProfile):
    """Fused RMSNorm; see ``rla.ops.rms_norm``."""
    return _rms_norm_op(x, weight, float(eps), profile.norm_weight == "per_op")[0]


def add_rms_norm(x, residual, weight, eps: float, profile: RoundingProfile):
    """Fused residual add + RMSNorm -> (normed, new_residual); see ``rla.ops.add_rms_norm``."""
    normed, new_residual, _ = _add_rms_norm_op(
        x,
        residual,
        weight,
        float(eps),
        profile.norm_weight == "per_op",
        profile.norm_residual == "fp32_sum",
    )
    return normed, new_residual
