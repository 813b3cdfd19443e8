"""The dose knob of the dose-response experiment (issue #19): a trainer that rounds more coarsely.

A dose arm (``train_dose_bits: B`` in the study's grid, with ``train_precision: aligned``;
``lab.dose.grid``) aligns the training copy to the engine profile as the aligned arm does, and
:class:`DoseOps`, the trainer's ``ops=`` plug, then rounds the output of every aligned region -- RoPE's
``q``/``k``, SwiGLU's ``silu(gate) * up``, RMSNorm's normalised output (also the post-attention
norm of the fused add + norm; the residual stream is left alone) -- to ``B`` explicit mantissa bits
with :func:`lab.dose.mantissa.round_mantissa` (round to nearest even, bf16's exponent range,
straight-through gradient). The rollout side is untouched: it stays the engine profile in bf16.

So the dose is a *physical* mismatch: the trainer computes the same function as the engine at the
same points, only with a coarser store at the points the alignment owns. ``B = 7`` is bf16 itself
and leaves the aligned arm unchanged; every bit fewer doubles the rounding step there, so the
per-token log-ratio's variance, and with it step-0 k3 (~ var / 2 for small deltas), grows about
4x per bit once the dose dominates the aligned arm's residual mismatch. The knob cannot go below
the aligned arm: it only adds rounding (the fp16 arm is the one point below it).

:class:`DoseOps` is the ``ops=`` implementation ``rla.align`` accepts: ``rla.ops`` under the
profile, then the rounding.
"""

from __future__ import annotations

import torch

from rla import ops as rla_ops
from lab.dose.mantissa import round_mantissa, round_mantissa_values

__all__ = ["DoseOps", "dose", "dose_values"]


def dose_values(x: torch.Tensor, bits: int, scale: float = 1.0) -> torch.Tensor:
    """``x + scale * (RN_bits(x) - x)`` in ``x``'s dtype, forward only (no autograd).

    ``scale = 1`` is ``round_mantissa(x, bits)`` exactly. Otherwise the sum is formed in fp32 and
    rounded once to ``x``'s dtype (nearest even), as a kernel storing its result would.
    """
    rounded = round_mantissa_values(x, bits)
    if scale == 1.0:
        return rounded
    f = x.detach().to(torch.float32)
    return (f + scale * (rounded.to(torch.float32) - f)).to(x.dtype)


class _Dose(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bits, scale):
        return dose_values(x, bits, scale)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def dose(x: torch.Tensor, bits: int, scale: float = 1.0) -> torch.Tensor:
    """:func:`dose_values` with a straight-through gradient (``d/dx := 1``)."""
    if scale == 1.0:
        return round_mantissa(x, bits)
    return _Dose.apply(x, bits, float(scale))


class DoseOps:
    """``rla.ops``' four region ops whose outputs get the dose: rounded to ``bits`` mantissa bits,
    the rounding error times ``scale`` (1: the rounding itself)."""

    def __init__(self, bits: int, scale: float = 1.0):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 23:
            raise ValueError(f"dose bits must be an int in [1, 23], got {bits!r}")
        if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < float("inf")):
            raise ValueError(f"dose scale must be a finite number > 0, got {scale!r}")
        self.bits, self.scale = bits, float(scale)
        error = "" if self.scale == 1.0 else f", error x {self.scale:g}"
        self.name = f"rla.ops + region outputs rounded to {bits} mantissa bits{error} (dose)"

    def __repr__(self) -> str:
        return f"DoseOps(bits={self.bits}, scale={self.scale:g})"

    def _r(self, t: torch.Tensor) -> torch.Tensor:
        return dose(t, self.bits, self.scale)

    def rope(self, q, k, cos, sin, profile, unsqueeze_dim: int = 1, dtype=None):
        q_out, k_out = rla_ops.rope(q, k, cos, sin, profile, unsqueeze_dim=unsqueeze_dim, dtype=dtype)
        return self._r(q_out), self._r(k_out)

    def swiglu(self, gate, up, profile):
        return self._r(rla_ops.swiglu(gate, up, profile))

    def rms_norm(self, x, weight, eps, profile, dtype=None, out_dtype=None):
        return self._r(rla_ops.rms_norm(x, weight, eps, profile, dtype=dtype, out_dtype=out_dtype))

    def add_rms_norm(self, x, residual, weight, eps, profile):
        normed, new_residual = rla_ops.add_rms_norm(x, residual, weight, eps, profile)
        return self._r(normed), new_residual
