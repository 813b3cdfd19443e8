"""The gated product of two same-shape tensors, a * b with an activation applied to one of them:
SwiGLU's silu(gate) * up and GeGLU's gelu_tanh(gate) * up (``reference.swiglu`` / ``geglu``, the
``swiglu`` point) and the gated attention's attn * sigmoid(gate) (``gate.attn_gate``, the
``attn_gate`` point). One autograd Function, so the rounding logic exists once.

Forward, the activation in fp32 of the lp input g: ``per_op`` = RN(RN(act(g)) * x) (HF's two ops
on lp tensors, the first run on the lp tensor itself, as HF runs it), ``fused`` = RN(act(g) * x), one rounding. ``lp`` is the first argument's dtype and
the product's operands keep the caller's order (a * b): each op runs the PyTorch ops it ran as a
Function of its own, on the same operands in the same order.

Backward, every reference op's: the rounding straight-through, each gradient one fp32 expression
rounded once to its input's dtype, d_x = RN(dy * value(g)), d_g = RN((dy * x) * slope(g)).
``value`` is act(g) as the backward forms it (silu as g * sigmoid(g), not F.silu's own bits) and
``slope`` act'(g); the two share sigmoid(g), formed once. Saved: the two inputs (HF's two ops keep
as many bytes); the rest is recomputed. Only the gradients asked for are formed.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from rla.ops._rounding import _as

__all__ = ["ACTS", "GatedProduct", "gated_product"]

_GELU_BETA = 0.7978845608028654  # sqrt(2 / pi), as PyTorch's kernels write it (M_SQRT2 * M_2_SQRTPI * 0.5)
_GELU_KAPPA = 0.044715


class Act(NamedTuple):
    """An activation of the gate, each part a function of the fp32 g."""

    forward: Callable  # act(g): the forward's value
    shared: Callable  # g -> what value and slope both read (sigmoid(g)), or None
    value: Callable  # (g, shared) -> act(g), the factor of d_x
    slope: Callable  # (g, shared) -> act'(g), the factor of d_g


def _gelu(g):
    return F.gelu(g, approximate="tanh")


def _gelu_slope(g, _):
    # d/dg of 0.5 g (1 + tanh(b (g + k g^3))) = 0.5 (1 + t) + 0.5 g (1 - t^2) b (1 + 3 k g^2)
    t = torch.tanh(_GELU_BETA * (g + _GELU_KAPPA * g * g * g))
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * (_GELU_BETA * (1.0 + 3.0 * _GELU_KAPPA * g * g))


ACTS = {
    "silu": Act(F.silu, torch.sigmoid, lambda g, s: g * s, lambda g, s: s * (1.0 + g * (1.0 - s))),
    # 1 - s as sigmoid(-g): no cancellation where s is near 1
    "sigmoid": Act(torch.sigmoid, torch.sigmoid, lambda g, s: s, lambda g, s: s * torch.sigmoid(-g)),
    "gelu_tanh": Act(_gelu, lambda g: None, lambda g, _: _gelu(g), _gelu_slope),
}


class GatedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, act: str, at: int, per_op: bool):
        lp = a.dtype
        if per_op:  # HF's op on the lp tensor: PyTorch computes it in fp32 and rounds, but a CPU's lp kernel need not
            # be its fp32 kernel (gelu_tanh of -5.0625 in bf16 is -1.5e-7 on an AVX512-BF16 EPYC, -0 via fp32)
            v = ACTS[act].forward((a, b)[at]).float()
        else:
            v = ACTS[act].forward((a, b)[at].float())
        ctx.save_for_backward(a, b)
        ctx.act, ctx.at = act, at
        return _as(v * b.float() if at == 0 else a.float() * v, lp)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        at, fn = ctx.at, ACTS[ctx.act]
        g, x = (a, b) if at == 0 else (b, a)
        gf, dyf = g.float(), dy.float()
        shared = fn.shared(gf)
        dg = dx = None
        if ctx.needs_input_grad[at]:
            dg = (dyf * x.float() * fn.slope(gf, shared)).to(g.dtype)
        if ctx.needs_input_grad[1 - at]:
            dx = (dyf * fn.value(gf, shared)).to(x.dtype)
        return (dg, dx, None, None, None) if at == 0 else (dx, dg, None, None, None)


def gated_product(a, b, act: str, at: int, per_op: bool):
    """``a * b`` with ``ACTS[act]`` applied to argument ``at`` (0: a, 1: b) first, rounded per op
    (``per_op``) or once (inputs already checked: one dtype, device and shape)."""
    return GatedProduct.apply(a, b, act, int(at), bool(per_op))
